"""The webhooks feature module, built from a provider list (tests add a throwaway provider)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from app.core.module import FeatureModule
from app.core.redis import make_call_bounded_redis
from app.core.resources import Resources
from app.webhooks.controllers import WebhookController
from app.webhooks.intake import ProviderIntake
from app.webhooks.providers import PROVIDERS, WebhookProvider
from app.webhooks.rate_limit import SlidingWindowRateLimiter

# A hung Redis may delay a webhook by at most this much in the rate limiter (then it fails open).
RATE_LIMIT_REDIS_TIMEOUT_SECONDS = 0.25


def build_webhooks_module(providers: Sequence[WebhookProvider] = PROVIDERS) -> FeatureModule:
    @asynccontextmanager
    async def lifespan(state: Any, resources: Resources) -> AsyncIterator[None]:
        settings = resources.settings
        redis = make_call_bounded_redis(settings.require_redis_url(), connect_timeout=RATE_LIMIT_REDIS_TIMEOUT_SECONDS)
        limiter = SlidingWindowRateLimiter(
            redis,
            limit=settings.webhook_rate_limit_per_minute,
            key_prefix=settings.redis_namespace,
            timeout=RATE_LIMIT_REDIS_TIMEOUT_SECONDS,
        )
        intakes = {}
        for provider in providers:
            verifier = provider.build_verifier(settings)
            if verifier is not None:
                intakes[provider.name] = ProviderIntake(provider, verifier, limiter, resources)
        state.webhook_intakes = intakes
        state.trusted_proxies = settings.trusted_proxies
        try:
            yield
        finally:
            await redis.aclose()

    from app.webhooks.cli import webhooks_group
    from app.webhooks.crons import WebhookRecoveryCronJob, WebhookRetentionCronJob
    from app.webhooks.jobs import ProcessWebhookEventJob

    return FeatureModule(
        name="webhooks",
        route_handlers=[WebhookController],
        jobs=[ProcessWebhookEventJob],
        crons=[WebhookRecoveryCronJob, WebhookRetentionCronJob],
        cli_groups=[webhooks_group],
        lifespan=lifespan,
    )


MODULE = build_webhooks_module()
