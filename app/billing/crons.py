"""Billing's cron: reconciliation with Stripe (``BILLING_RECONCILE_CRON``)."""

from __future__ import annotations

import logging

from app.billing.reconcile import reconcile_billing
from app.queue.job import CronJob, CronTick, FromSetting

logger = logging.getLogger(__name__)


class BillingReconcileCronJob(CronJob):
    """Syncs every linked workspace not synced for BILLING_RECONCILE_AFTER_HOURS, through the Stripe budget."""

    pattern = FromSetting("billing_reconcile_cron")
    # Thousands of workspaces at the budget's 20 reads per second take minutes.
    timeout_seconds = 3600

    async def handle(self, data: CronTick) -> None:
        if not self.resources.settings.stripe_enabled:
            logger.info("Billing reconciliation: BILLING_PROVIDER=none, nothing to reconcile.")
            return
        await reconcile_billing(self.resources)
