"""The inbox's crons; their patterns come from settings (WEBHOOK_RECOVERY_CRON, _RETENTION_CRON, _BACKFILL_CRON)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import msgspec

from app.core.commands import plural
from app.core.module import loaded_modules
from app.queue.errors import PermanentError
from app.queue.job import CronJob, CronTick, FromSetting, Job
from app.queue.queues import QueueName
from app.webhooks.backfill import backfill, event_sources
from app.webhooks.maintenance import delete_old_processed, delete_past_retention, recover

logger = logging.getLogger(__name__)


class WebhookRecoveryCronJob(CronJob):
    """Queues stuck events again and sets aside those that used up their attempts."""

    pattern = FromSetting("webhook_recovery_cron")

    async def handle(self, data: CronTick) -> None:
        report = await recover(self.resources)
        logger.info(
            "Webhook recovery: %s re-queued, %s already queued, %s set aside.",
            report.requeued,
            report.already_queued,
            report.set_aside,
        )


class WebhookRetentionCronJob(CronJob):
    """Deletes processed events older than WEBHOOK_EVENT_RETENTION_DAYS, in batches; then what the loaded modules
    keep for a time (``MODULE.retention``: identity's change journal, WORKSPACE_CHANGE_RETENTION_DAYS)."""

    pattern = FromSetting("webhook_retention_cron")

    async def handle(self, data: CronTick) -> None:
        deleted = await delete_old_processed(self.resources)
        logger.info("Webhook retention: deleted %s.", plural(deleted, "processed event"))
        for what, count in (await delete_past_retention(self.resources)).items():
            logger.info("Retention: deleted %s.", plural(count, what))


class WebhookBackfillCronJob(CronJob):
    """Stores the events a provider lists but the inbox never received (lost upstream), and alerts once.

    It asks for the last WEBHOOK_BACKFILL_LOOKBACK_HOURS, up to WEBHOOK_BACKFILL_GRACE_SECONDS before its tick.
    """

    pattern = FromSetting("webhook_backfill_cron")

    async def handle(self, data: CronTick) -> None:
        settings = self.resources.settings
        # Younger events may still be on their way (a delivery takes seconds): the next run looks at them.
        until = data.slot - timedelta(seconds=settings.webhook_backfill_grace_seconds)
        since = until - timedelta(hours=settings.webhook_backfill_lookback_hours)
        for provider, source in event_sources(loaded_modules(self.resources)).items():
            if provider == "stripe" and not settings.stripe_enabled:
                continue
            report = await backfill(self.resources, provider, source, since, until)
            logger.info("Webhook backfill: %s", report.summary())


class BackfillWindow(msgspec.Struct, frozen=True):
    provider: str
    since: datetime
    until: datetime


class WebhookBackfillJob(Job[BackfillWindow]):
    """A backfill of one window, asked for by an operator (the operations page): the cron's work, on demand."""

    queue = QueueName.CRON
    timeout_seconds = 3600

    async def handle(self, data: BackfillWindow) -> None:
        source = event_sources(loaded_modules(self.resources)).get(data.provider)
        if source is None:
            raise PermanentError(f"No backfill for {data.provider!r}: its module offers no list of events.")
        report = await backfill(self.resources, data.provider, source, data.since, data.until)
        logger.info("Webhook backfill asked for by an operator: %s", report.summary())
