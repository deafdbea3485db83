"""The worked example of a cron: every Monday 08:00 UTC, one summary job per active workspace."""

from __future__ import annotations

import logging

from app.clients.jobs import SendClientSummaryJob, SendClientSummaryJobData
from app.identity.directory import active_workspace_ids
from app.queue.job import CronJob, CronTick

logger = logging.getLogger(__name__)
BATCH_SIZE = 500


class SendWeeklySummariesCronJob(CronJob):
    """Only queues jobs (one per workspace): the sending retries per workspace, not as a whole."""

    pattern = "0 8 * * 1"

    async def handle(self, data: CronTick) -> None:
        period = data.slot.date().isoformat()
        queued = 0
        after_id = 0
        while True:
            async with self.resources.db.session() as session:
                ids = await active_workspace_ids(session, after_id=after_id, limit=BATCH_SIZE)
            if not ids:
                break
            for workspace_id in ids:
                # The id makes a retried cron queue nothing twice.
                await self.resources.queue.add(
                    SendClientSummaryJob,
                    SendClientSummaryJobData(workspace_id=workspace_id, period=period),
                    deduplication_id=f"client-summary:{workspace_id}:{period}",
                )
                queued += 1
            after_id = ids[-1]
        logger.info("Queued %d weekly summaries for %s.", queued, period)
