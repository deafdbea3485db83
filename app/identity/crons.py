"""Identity's cron: reconciliation with Clerk (``IDENTITY_RECONCILE_CRON``), when ``CLERK_SECRET_KEY`` is set."""

from __future__ import annotations

import logging

from app.identity.reconcile import reconcile_identity
from app.queue.job import CronJob, CronTick, FromSetting

logger = logging.getLogger(__name__)


class IdentityReconcileCronJob(CronJob):
    """Lists every user, organization and membership from Clerk and applies each as its webhook would be.

    The full pass, as ``identity reconcile`` runs it: rows whose Clerk object is
    gone (Clerk answers 404 when each is read again) are soft-deleted too, so a
    deletion missed while the webhook endpoint was down is repaired by one run.
    """

    pattern = FromSetting("identity_reconcile_cron")
    # Every page of every kind: a large instance takes minutes.
    timeout_seconds = 3600

    async def handle(self, data: CronTick) -> None:
        if not self.resources.settings.clerk_secret_key:
            logger.info("Clerk reconciliation: CLERK_SECRET_KEY is not set, so it is off.")
            return
        await reconcile_identity(self.resources)
