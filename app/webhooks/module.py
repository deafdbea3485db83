"""The webhooks feature module, built from a provider list (tests add a throwaway provider)."""

from __future__ import annotations

from collections.abc import Sequence

from litestar.types import ControllerRouterHandler
from redis.asyncio import Redis

from app.core.module import FeatureModule
from app.core.rate_limit import SlidingWindowRateLimiter
from app.core.redis import make_redis
from app.core.resources import Resources
from app.queue.queues import STARTER_QUEUES
from app.webhooks.cli import webhooks_group
from app.webhooks.controllers import webhook_route
from app.webhooks.crons import (
    WebhookBackfillCronJob,
    WebhookBackfillJob,
    WebhookRecoveryCronJob,
    WebhookRetentionCronJob,
)
from app.webhooks.handlers import handled_types, stored_keys
from app.webhooks.intake import WebhookIntake
from app.webhooks.jobs import ProcessWebhookEventJob, processing_job
from app.webhooks.models import WebhookEvent
from app.webhooks.providers import PROVIDERS, WebhookProvider
from app.webhooks.refusals import RefusalLog
from app.webhooks.verification import checking_handled

# A hung Redis may delay a webhook by at most this much in the rate limiter (then it fails open).
RATE_LIMIT_REDIS_TIMEOUT_SECONDS = 0.25


def build_webhooks_module(providers: Sequence[WebhookProvider] = PROVIDERS) -> FeatureModule:
    def routes(resources: Resources) -> list[ControllerRouterHandler]:
        """One route per enabled provider; a provider switched off has none, so it answers 404."""
        settings = resources.settings
        redis: Redis = make_redis(
            settings.require_redis_url(), timeout=RATE_LIMIT_REDIS_TIMEOUT_SECONDS, per_command=False
        )
        resources.add_closer(redis.aclose)
        limiter = SlidingWindowRateLimiter(
            redis,
            limit=settings.webhook_rate_limit_per_minute,
            key_prefix=settings.redis_namespace,
            timeout=RATE_LIMIT_REDIS_TIMEOUT_SECONDS,
        )
        refusals = RefusalLog(redis, settings.redis_namespace)
        handlers: list[ControllerRouterHandler] = []
        for provider in providers:
            verifier = provider.build_verifier(settings)
            if verifier is None:
                continue
            handles = handled_types(resources.modules, provider.name)
            verifier = checking_handled(verifier, handles, provider.check_handled_body)
            guard = provider.guard(provider.name, verifier, trusted_proxies=settings.trusted_proxies, refusals=refusals)
            keys = stored_keys(resources.modules, provider.name)
            intake = WebhookIntake(provider, handles, keys, limiter, refusals, resources)
            handlers.append(webhook_route(intake, guard, settings.webhook_max_body_bytes))
        return handlers

    return FeatureModule(
        name="webhooks",
        route_factory=routes,
        jobs=list(
            dict.fromkeys(
                [ProcessWebhookEventJob, *(processing_job(p.name, p.queue) for p in providers), WebhookBackfillJob]
            )
        ),
        queues=list(dict.fromkeys(p.queue for p in providers if p.queue not in STARTER_QUEUES)),
        crons=[WebhookRecoveryCronJob, WebhookRetentionCronJob, WebhookBackfillCronJob],
        cli_groups=[webhooks_group],
        models=[WebhookEvent],
    )


MODULE = build_webhooks_module()
