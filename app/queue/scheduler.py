"""Each worker process runs this scheduler: it queues every cron's latest due tick.

Every worker queues the same tick under the same job id, so the queue keeps one;
the ``cron_run`` row makes a late duplicate a no-op. At start, a tick missed
while every worker was down is queued once (only the latest, never a burst),
and only for a cron that ran before: a fresh install does not fire every cron.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime

from app.core.db import Database
from app.core.resources import MessageQueue
from app.core.settings import Settings
from app.queue.crons import Clock, SystemClock, cron_job_id, last_slots, latest_tick
from app.queue.errors import QueueUnavailableError
from app.queue.job import CronJob, CronTick

logger = logging.getLogger(__name__)
RETRY_START_SECONDS = 5.0


class CronScheduler:
    def __init__(
        self,
        queue: MessageQueue,
        db: Database,
        settings: Settings,
        crons: list[type[CronJob]],
        *,
        clock: Clock | None = None,
    ) -> None:
        self.queue = queue
        self.db = db
        self.patterns = {cron.name(): (cron, cron.schedule(settings)) for cron in crons}
        self.clock = clock or SystemClock()
        self.queued_up_to: dict[str, datetime] = {}
        self._queue_down = False
        self._stopped = asyncio.Event()

    def stop(self) -> None:
        self._stopped.set()

    async def run(self) -> None:
        if not self.patterns or not await self._start():
            return
        while not self._stopped.is_set():
            await self.tick()
            await self._pause(self.clock.read_every_seconds)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stopped.wait()

    async def _start(self) -> bool:
        while not self._stopped.is_set():
            try:
                ran = await last_slots(self.db, list(self.patterns))
                break
            except Exception as exc:
                logger.warning(
                    "Cron scheduler cannot read cron_run (%s: %s): retrying in %.0f s.",
                    type(exc).__name__,
                    exc,
                    RETRY_START_SECONDS,
                )
                await self._pause(RETRY_START_SECONDS)
        else:
            return False
        now = self.clock.now()
        for name, (_, pattern) in self.patterns.items():
            due = latest_tick(pattern, now)
            last = ran.get(name)
            if last is not None and last < due:
                logger.info("Cron %s missed its tick %s while no worker ran: running it once now.", name, due)
                # Leave the mark before ``due`` so the first tick() queues it.
                self.queued_up_to[name] = last
            else:
                self.queued_up_to[name] = due
        logger.info("Cron scheduler started for %s.", ", ".join(self.patterns))
        return True

    async def tick(self) -> None:
        now = self.clock.now()
        for name, (cron_cls, pattern) in self.patterns.items():
            due = latest_tick(pattern, now)
            if due <= self.queued_up_to[name]:
                continue
            if await self._enqueue(cron_cls, due):
                self.queued_up_to[name] = due

    async def _enqueue(self, cron_cls: type[CronJob], slot: datetime) -> bool:
        name = cron_cls.name()
        try:
            job_id = await self.queue.add(cron_cls, CronTick(slot=slot), deduplication_id=cron_job_id(name, slot))
        except QueueUnavailableError as exc:
            if not self._queue_down:
                logger.warning("Cron %s tick %s not queued yet: %s Retrying.", name, slot, exc)
            self._queue_down = True
            return False
        except Exception:
            logger.exception("Cron %s tick %s could not be queued; retrying.", name, slot)
            return False
        self._queue_down = False
        if job_id is None:
            logger.debug("Cron %s tick %s is already queued.", name, slot)
        else:
            logger.info("Cron %s tick %s queued.", name, slot)
        return True
