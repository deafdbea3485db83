"""Jobs and a cron for the queue tests, loaded into real workers with ``--module tests.queue.sample_jobs:MODULE``.

Each run records its start and end in ``queue_test_event`` (a table the tests
create themselves), with the worker's pid and the attempt number.
"""

from __future__ import annotations

import asyncio
import logging
import os

import msgspec
import structlog
from sqlalchemy import text

from app.core.module import FeatureModule
from app.queue.errors import PermanentError, RetryLater
from app.queue.job import CronJob, CronTick, Job
from app.queue.queues import QueueName

CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS queue_test_event (
    id bigserial PRIMARY KEY,
    job text NOT NULL,
    key text NOT NULL,
    event text NOT NULL,
    attempt int NOT NULL,
    pid int NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
stdlib_logger = logging.getLogger("tests.sample_jobs")


class RecordData(msgspec.Struct, frozen=True):
    key: str
    sleep_seconds: float = 0.0
    fail_times: int = 0  # the first N tries raise
    retry_later_seconds: float = 0.0  # if set, those tries raise RetryLater with this delay
    permanent: bool = False


class RecordJob(Job[RecordData]):
    queue = QueueName.DEFAULT
    backoff_base_seconds = 0.2
    backoff_cap_seconds = 1.0
    # Short, so a SIGKILLed worker's job is free again after 3 + 2 + 10 s (the queue's largest timeout counts).
    timeout_seconds = 3

    async def handle(self, data: RecordData) -> None:
        await self.record(data.key, "start")
        stdlib_logger.info("sample job %s working", data.key)
        structlog.get_logger("tests.sample_jobs").info("sample job structlog line", key=data.key)
        if data.sleep_seconds:
            await asyncio.sleep(data.sleep_seconds)
        if data.permanent:
            raise PermanentError(f"planned permanent failure of {data.key}")
        if self.context.attempt <= data.fail_times and data.retry_later_seconds:
            raise RetryLater(f"planned retry-later of {data.key}", after_seconds=data.retry_later_seconds)
        if self.context.attempt <= data.fail_times:
            raise RuntimeError(f"planned failure {self.context.attempt} of {data.key}")
        await self.record(data.key, "end")

    async def starts(self, key: str) -> int:
        async with self.resources.db.session() as session:
            query = "SELECT count(*) FROM queue_test_event WHERE key = :k AND event = 'start'"
            return int(await session.scalar(text(query), {"k": key}) or 0)

    async def record(self, key: str, event: str) -> None:
        async with self.resources.db.session() as session:
            await session.execute(
                text("INSERT INTO queue_test_event (job, key, event, attempt, pid) VALUES (:j, :k, :e, :a, :p)"),
                {"j": self.name(), "k": key, "e": event, "a": self.context.attempt, "p": os.getpid()},
            )
            await session.commit()


class NoopData(msgspec.Struct, frozen=True):
    n: int


class NoopJob(Job[NoopData]):
    """Does nothing: the drain benchmark measures the queue's own cost per job."""

    queue = QueueName.DEFAULT
    timeout_seconds = 3

    async def handle(self, data: NoopData) -> None:
        return None


class UnlistedJob(Job[RecordData]):
    """Defined, but in no module the worker loads."""

    queue = QueueName.DEFAULT

    async def handle(self, data: RecordData) -> None:
        raise AssertionError("an unlisted job must never run")


class TenantRecordData(msgspec.Struct, frozen=True):
    key: str
    workspace: str
    sleep_seconds: float = 0.0


class TenantRecordJob(Job[TenantRecordData]):
    """A SaaS developer's job that says whose work it is by naming a field of its data."""

    queue = QueueName.DEFAULT
    tenant_field = "workspace"
    timeout_seconds = 3

    async def handle(self, data: TenantRecordData) -> None:
        if data.sleep_seconds:
            await asyncio.sleep(data.sleep_seconds)
        await RecordJob(self.context).record(data.key, "start")


class EveryMinuteCronJob(CronJob):
    queue = QueueName.DEFAULT
    pattern = "* * * * *"
    timeout_seconds = 3

    async def handle(self, data: CronTick) -> None:
        async with self.resources.db.session() as session:
            await session.execute(
                text("INSERT INTO queue_test_event (job, key, event, attempt, pid) VALUES (:j, :k, 'run', :a, :p)"),
                {"j": self.name(), "k": data.slot.isoformat(), "a": self.context.attempt, "p": os.getpid()},
            )
            await session.commit()


MODULE = FeatureModule(name="queue-tests", jobs=[RecordJob, NoopJob, TenantRecordJob])
# Only the cron tests load this one: on the wall clock it would fire in any test crossing a minute.
CRON_MODULE = FeatureModule(name="queue-tests-cron", crons=[EveryMinuteCronJob])
