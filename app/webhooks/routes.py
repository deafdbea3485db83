"""The webhooks module's routes (``MODULE.api``): ``POST /webhooks/<name>`` for each enabled provider."""

from __future__ import annotations

from collections.abc import Sequence

from litestar.types import ControllerRouterHandler
from redis.asyncio import Redis

from app.core.module import ApiPart, loaded_modules
from app.core.rate_limit import SlidingWindowRateLimiter
from app.core.redis import make_redis
from app.core.resources import Resources
from app.webhooks.controllers import webhook_route
from app.webhooks.guards import WebhookSignatureGuard
from app.webhooks.handlers import handled_types, stored_keys
from app.webhooks.intake import WebhookIntake
from app.webhooks.providers import PROVIDERS, WebhookProvider
from app.webhooks.refusals import RefusalLog
from app.webhooks.verification import checking_handled

# A hung Redis may delay a webhook by at most this much in the rate limiter (then it fails open).
RATE_LIMIT_REDIS_TIMEOUT_SECONDS = 0.25


def intake_api(providers: Sequence[WebhookProvider]) -> ApiPart:
    """The routes of these providers (a test's throwaway provider among them)."""

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
            handles = handled_types(loaded_modules(resources), provider.name)
            verifier = checking_handled(verifier, handles, provider.check_handled_body)
            guard_class = provider.guard or WebhookSignatureGuard
            guard = guard_class(provider.name, verifier, trusted_proxies=settings.trusted_proxies, refusals=refusals)
            keys = stored_keys(loaded_modules(resources), provider.name)
            intake = WebhookIntake(provider, handles, keys, limiter, refusals, resources)
            handlers.append(webhook_route(intake, guard, settings.webhook_max_body_bytes))
        return handlers

    return ApiPart(route_factory=routes)


API = intake_api(PROVIDERS)
