"""The inbox's crons; their patterns come from settings (WEBHOOK_RECOVERY_CRON, WEBHOOK_RETENTION_CRON)."""

from __future__ import annotations

import logging

from app.queue.job import CronJob, CronTick, FromSetting
from app.webhooks.maintenance import delete_old_processed, recover

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
    """Deletes processed events older than WEBHOOK_EVENT_RETENTION_DAYS, in batches."""

    pattern = FromSetting("webhook_retention_cron")

    async def handle(self, data: CronTick) -> None:
        deleted = await delete_old_processed(self.resources)
        logger.info("Webhook retention: deleted %s processed events.", deleted)
