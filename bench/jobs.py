"""Reference jobs for the drain measurement, loaded into real workers with ``--module bench.jobs:MODULE``.

The no-op and one-UPDATE jobs live on the Clerk events' queue, so the same
arq Worker (same process, same settings, same slots) drains the Clerk backlog
and these jobs. A ping job per queue tells the harness a worker serving that
queue is polling.
"""

from __future__ import annotations

import os

import msgspec
from sqlalchemy import text

from app.core.module import FeatureModule
from app.queue.job import Job
from app.queue.queues import QueueName

ITEM_TABLE = "bench_item"
CREATE_ITEM_TABLE = f"""
CREATE TABLE IF NOT EXISTS {ITEM_TABLE} (
    id bigint PRIMARY KEY,
    n int NOT NULL DEFAULT 0,
    done_at timestamptz
)
"""
_UPDATE = text(f"UPDATE {ITEM_TABLE} SET n = n + 1, done_at = clock_timestamp() WHERE id = :id")


def ready_key(namespace: str) -> str:
    """A Redis set of the pids of workers that ran a ping job: the harness waits for every worker in it."""
    return f"{namespace}bench:ready"


class BenchItem(msgspec.Struct, frozen=True):
    id: int


class BenchNoopJob(Job[BenchItem]):
    """Does nothing: the queue's own cost per job."""

    queue = QueueName.WEBHOOK_CLERK

    async def handle(self, data: BenchItem) -> None:
        return None


class BenchUpdateJob(Job[BenchItem]):
    """One UPDATE in its own transaction, through the shared session maker (how a job usually writes)."""

    queue = QueueName.WEBHOOK_CLERK

    async def handle(self, data: BenchItem) -> None:
        async with self.resources.db.session() as session:
            await session.execute(_UPDATE, {"id": data.id})
            await session.commit()


class BenchPingJob(Job[BenchItem]):
    """Records which worker process ran it: the harness knows a worker is polling once its pid shows up."""

    queue = QueueName.WEBHOOK_CLERK

    async def handle(self, data: BenchItem) -> None:
        key = ready_key(self.resources.settings.redis_namespace)
        await self.resources.redis.sadd(key, os.getpid())  # type: ignore[misc]


def _ping_on(queue: QueueName) -> type[BenchPingJob]:
    if queue == BenchPingJob.queue:
        return BenchPingJob
    words = "".join(word.capitalize() for word in queue.removesuffix("-queue").split("-"))
    return type(f"BenchPing{words}Job", (BenchPingJob,), {"queue": queue, "__module__": __name__})


PING_JOBS: dict[str, type[BenchPingJob]] = {str(queue): _ping_on(queue) for queue in QueueName}
"""The ping job of each queue: a worker is seen polling once it ran the one of a queue it serves."""

MODULE = FeatureModule(name="bench", jobs=[BenchNoopJob, BenchUpdateJob, *PING_JOBS.values()])
