"""The webhooks feature module, built from a provider list (tests add a throwaway provider)."""

from __future__ import annotations

from collections.abc import Sequence

from app.core.module import ApiPart, FeatureModule
from app.queue.queues import STARTER_QUEUES
from app.webhooks.cli import webhooks_group
from app.webhooks.crons import (
    WebhookBackfillCronJob,
    WebhookBackfillJob,
    WebhookRecoveryCronJob,
    WebhookRetentionCronJob,
)
from app.webhooks.jobs import ProcessWebhookEventJob, provider_job
from app.webhooks.models import WebhookEvent
from app.webhooks.providers import PROVIDERS, WebhookProvider


def build_webhooks_module(
    providers: Sequence[WebhookProvider] = PROVIDERS, api: ApiPart | str = "app.webhooks.routes:API"
) -> FeatureModule:
    """``providers``: whose events its jobs process; ``api``: its routes, the shipped providers' by default
    (``app/webhooks/routes.py``; ``intake_api(providers)`` gives other providers' routes)."""
    return FeatureModule(
        name="webhooks",
        api=api,
        jobs=list(dict.fromkeys([ProcessWebhookEventJob, *(provider_job(p) for p in providers), WebhookBackfillJob])),
        queues=list(dict.fromkeys(p.queue for p in providers if p.queue not in STARTER_QUEUES)),
        crons=[WebhookRecoveryCronJob, WebhookRetentionCronJob, WebhookBackfillCronJob],
        cli_groups=[webhooks_group],
        models=[WebhookEvent],
    )


MODULE = build_webhooks_module()
