"""The soak's own recovery passes, once its faults are over: it does not wait for the recovery cron's minute.

The workers' cron runs ``WebhookRecoveryCronJob`` every minute (``* * * * *``).
Once the sending and the faults are over, whenever the pipeline stands idle
short of drained (no job queued, waiting or running, and some event neither
processed nor set aside), the soak queues a tick of its own, as the ops page's
"Run now" queues one (a manual tick: it collides with no scheduled one), and
a worker runs it at once: it sets aside the events that used up their attempts
(each with its alert, from that worker) and queues again the events whose jobs
Redis lost. A tick requeues only events older than the recovery delay, so the
passes are that far apart.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from app.core.settings import load_settings
from app.queue.crons import cron_job_id
from app.queue.job import CronTick
from app.runtime import open_resources
from app.webhooks.crons import WebhookRecoveryCronJob
from bench.soak.cluster import Cluster


class RecoveryPasses:
    def __init__(self, cluster: Cluster) -> None:
        self.resources = open_resources(load_settings(cluster.env()), ())
        self.every = cluster.config.recovery_after_seconds + 1.0
        self.last = float("-inf")
        self.queued = 0

    async def when_idle(self) -> None:
        """Called while the pipeline stands idle short of drained: a pass, unless one was queued lately."""
        if time.monotonic() - self.last < self.every:
            return
        self.last = time.monotonic()
        slot = datetime.now(UTC)
        name = WebhookRecoveryCronJob.name()
        deduplication_id = cron_job_id(name, slot, manual=True)
        await self.resources.queue.add(WebhookRecoveryCronJob, CronTick(slot=slot), deduplication_id=deduplication_id)
        self.queued += 1
        print(f"soak: the pipeline is idle short of drained: a recovery pass queued ({self.queued})", flush=True)

    async def close(self) -> None:
        await self.resources.close()
