"""Backlogs that become due at one instant: what the drain phases time, through arq's own due times.

The workers are started first and seen polling (``run.fleet.workers``). A
backlog is then queued with one common due time a little ahead (``due_in``):
every job is encoded with a delay and then given that fixed instant as its due
time (the delay alone would drift by the time between two clock reads), so each
job's score is that instant, and nothing touches arq's keys but the product's
queue.
The clock starts at that instant (``until_due``), when the polling workers find
every job due at once. Workers already running are warm (their connections
open, their statements prepared), and started before the instant, not timed
from their start.

A delayed job keeps its real due time and takes no tenant's turn: a phase
measuring fairness queues its jobs without a delay (``queue_now``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from app.queue.arq_driver import ArqQueue
from app.queue.encoded import encode_jobs
from app.queue.job import Job
from app.webhooks.jobs import ProcessWebhookEventData, deduplication_id, processing_job, queue_processing_many
from bench.inbox import Stored

if TYPE_CHECKING:
    from bench.harness import Run

BATCH = 500  # jobs per call, as the recovery cron and the outbox relay queue them
LEAD_SECONDS = 1.0  # ahead of the instant, on top of the time the jobs take to queue...
LEAD_PER_JOB_SECONDS = 0.00015  # ...about 3 times what encoding and queueing one in a batch costs (phase adapter)

Item = tuple[Any, str | None, str | None]  # data, deduplication id, tenant key


@dataclass(frozen=True)
class Due:
    at: float
    """When every job of the backlog is due (epoch seconds)."""

    @property
    def at_ms(self) -> int:
        """The instant as the queue's score (epoch milliseconds)."""
        return round(self.at * 1000)

    def perf_counter(self) -> float:
        """That instant on ``time.perf_counter()``'s clock, the one the phases time with."""
        return time.perf_counter() + (self.at - time.time())


def due_in(count: int) -> Due:
    """An instant far enough ahead to queue ``count`` jobs before it."""
    return Due(time.time() + LEAD_SECONDS + count * LEAD_PER_JOB_SECONDS)


async def queue_due(run: Run, job_cls: type[Job[Any]], items: Sequence[Item], due: Due) -> None:
    """Queue one job per item, every one due at ``due``; every one must be queued (none deduplicated away)."""
    queue = cast(ArqQueue, run.resources.queue)
    for start in range(0, len(items), BATCH):
        part = items[start : start + BATCH]
        delay = timedelta(seconds=due.at - time.time())  # from the fixed instant: the same due time every call
        if delay <= timedelta(0):
            raise RuntimeError(f"{job_cls.name()}: the backlog took longer to queue than its lead; raise LEAD_*")
        encoded = encode_jobs(
            run.resources.settings,
            job_cls,
            [(data, dedup, None) for data, dedup, _ in part],
            delay=delay,  # a delayed job is placed at its due time, not by its tenant's turn
            tenant_keys=[tenant for _, _, tenant in part],
        )
        jobs = [replace(job, run_at_ms=due.at_ms) for job in encoded]
        queued = await queue.enqueue_encoded(jobs, what=f"{len(jobs)} {job_cls.name()}")
        if any(job_id is None for job_id in queued):
            raise RuntimeError(f"{job_cls.name()}: a backlog job was not queued")


async def queue_events_due(run: Run, rows: Sequence[Stored], due: Due) -> None:
    """The processing jobs of stored inbox rows (each provider's job class), due at ``due``."""
    for provider in dict.fromkeys(row.provider for row in rows):
        mine = [row for row in rows if row.provider == provider]
        items = [(ProcessWebhookEventData(row.row_id), deduplication_id(row.row_id), row.tenant_key) for row in mine]
        await queue_due(run, processing_job(provider), items, due)


async def queue_now(run: Run, rows: Sequence[Stored]) -> None:
    """The processing jobs of stored rows asked for now, as the recovery cron queues them: pages of ``BATCH``,
    each job placed by its tenant's turn."""
    entries = [(row.provider, row.row_id, row.tenant_key, None) for row in rows]
    for start in range(0, len(entries), BATCH):
        await queue_processing_many(run.resources.queue, entries[start : start + BATCH])


async def until_due(due: Due, ahead: float = 0.0) -> float:
    """Sleep until ``ahead`` seconds before the instant; returns the instant on ``perf_counter``'s clock."""
    wait = due.at - ahead - time.time()
    if wait > 0:
        await asyncio.sleep(wait)
    return due.perf_counter()
