"""The arq driver: jobs go to arq's Redis queues, one round trip per call (one job or many), with a bounded wait.

Everything written to Redis carries ``settings.redis_namespace``: the arq queue
is ``<namespace><queue name>`` and a job id is ``<namespace><deduplication id>``
(or a random id), so tests and several apps can share one Redis. Jobs are
written and a job's state is read by ``app.queue.arq_adapter`` (one script
call, placed by their tenant's turn), which alone knows arq's keys.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, cast

from arq.connections import ArqRedis
from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncSession

from app.core import tracing
from app.core.db import Database
from app.core.redaction import redact_url
from app.core.redis import FAST_TIMEOUT_SECONDS, make_redis
from app.core.resources import JobOptions, JobState, MessageQueue
from app.core.settings import Settings
from app.queue.arq_adapter import ArqEnqueuer, job_state
from app.queue.encoded import EncodedJob, encode_job, encode_jobs, namespaced, now_ms
from app.queue.errors import QueueUnavailableError
from app.queue.job import Job
from app.queue.outbox import relay_outbox, stage
from app.queue.serialization import deserialize, serialize

logger = logging.getLogger(__name__)


def make_arq_redis(url: str, *, timeout: float, per_command: bool = True) -> ArqRedis:
    """An arq pool that gives up after ``timeout`` (see ``make_redis``), reading and writing JSON, never pickle."""
    redis = cast(ArqRedis, make_redis(url, timeout=timeout, per_command=per_command, client=ArqRedis))
    redis.job_serializer = serialize
    redis.job_deserializer = deserialize
    return redis


class ArqQueue(MessageQueue):
    def __init__(self, settings: Settings, db: Database, *, timeout: float = FAST_TIMEOUT_SECONDS) -> None:
        self.settings = settings
        self.db = db
        self.timeout = timeout
        # Every call below runs under asyncio.timeout(self.timeout).
        self.redis = make_arq_redis(self.settings.require_redis_url(), timeout=timeout, per_command=False)
        self._enqueuer = ArqEnqueuer(self.redis, settings)

    async def _add(
        self, job_cls: type[Job[Any]], data: Any, options: JobOptions, *, session: AsyncSession | None
    ) -> str | None:
        with _producing(job_cls, 1):  # the job continues this span (tracing on)
            job = encode_job(self.settings, job_cls, data, options)
            if session is not None:
                stage(session, job)
                return job.job_id
            (queued,) = await self.enqueue_encoded([job], what=job_cls.name())
        return queued

    async def _add_many(self, job_cls: type[Job[Any]], jobs: Sequence[tuple[Any, JobOptions]]) -> list[str | None]:
        with _producing(job_cls, len(jobs)):
            encoded = encode_jobs(
                self.settings,
                job_cls,
                [(data, options.deduplication_id, options.request_id) for data, options in jobs],
                tenant_keys=[options.tenant_key for _, options in jobs],
                trace_contexts=[options.trace_context for _, options in jobs],
            )
            return await self.enqueue_encoded(encoded, what=job_cls.name())

    async def enqueue_encoded(self, jobs: Sequence[EncodedJob], *, what: str) -> list[str | None]:
        """Queue jobs already encoded (by ``add_many``, or rebuilt from outbox rows) in one round trip.

        No job class is needed: a relay queues the jobs of modules it does not load.
        """
        if not jobs:
            return []
        try:
            async with asyncio.timeout(self.timeout):
                results = await self._enqueuer.enqueue(jobs, now_ms())
        except (TimeoutError, RedisError, OSError) as exc:
            raise self._unavailable(what, exc) from exc
        return [self._queued_id(job, queued) for queued, job in zip(results, jobs, strict=True)]

    async def relay_outbox(self, *, session: AsyncSession | None = None) -> int:
        async def send(jobs: list[EncodedJob]) -> None:
            await self.enqueue_encoded(jobs, what=f"{len(jobs)} staged job(s) ({_names(jobs)})")

        return await relay_outbox(self.db, send, session=session)

    def _queued_id(self, job: EncodedJob, queued: bool) -> str | None:
        if not queued:
            logger.debug("%s %s is already queued or running: not queued again.", job.name, job.job_id)
            return None
        return job.job_id

    def _unavailable(self, what: str, exc: BaseException) -> QueueUnavailableError:
        return QueueUnavailableError(
            f"Could not queue {what}: Redis at {redact_url(self.settings.require_redis_url())} "
            f"did not accept it within {self.timeout:g} s ({type(exc).__name__}: {exc or 'timed out'}). "
            "The job was not queued; check that Redis is running and REDIS_URL points at it."
        )

    async def state(self, deduplication_id: str, queue: str) -> JobState:
        """Whether the job with that deduplication id waits on ``queue`` (due or deferred), runs, or is absent."""
        try:
            async with asyncio.timeout(self.timeout):
                return await job_state(self.redis, self.settings, namespaced(self.settings, deduplication_id), queue)
        except (TimeoutError, RedisError, OSError) as exc:
            raise QueueUnavailableError(
                f"Could not read the state of job {deduplication_id!r}: Redis did not answer within "
                f"{self.timeout:g} s ({type(exc).__name__}: {exc or 'timed out'})."
            ) from exc

    async def close(self) -> None:
        await self.redis.aclose(close_connection_pool=True)


def _producing(job_cls: type[Job[Any]], count: int) -> AbstractContextManager[Any]:
    """The span of queueing jobs of one class (tracing on): what the jobs' attempts follow."""
    if not tracing.is_on():
        return tracing.NOT_TRACED
    attributes: dict[str, str | int] = {
        "messaging.system": "arq",
        "messaging.operation.type": "send",
        "messaging.destination.name": str(job_cls.queue),
    }
    if count != 1:
        attributes["messaging.batch.message_count"] = count
    return tracing.span(f"enqueue {job_cls.name()}", "producer", attributes, covers_its_calls=True)


def _names(jobs: Sequence[EncodedJob]) -> str:
    return ", ".join(sorted({job.name for job in jobs}))
