"""The arq driver: jobs go to arq's Redis queues, one round trip per call (one job or many), with a bounded wait.

Everything written to Redis carries ``settings.redis_namespace``: the arq queue
is ``<namespace><queue name>`` and a job id is ``<namespace><deduplication id>``
(or a random id), so tests and several apps can share one Redis.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, cast

from arq.connections import ArqRedis
from arq.constants import in_progress_key_prefix, job_key_prefix, result_key_prefix
from arq.jobs import serialize_job
from arq.utils import timestamp_ms
from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.db import Database
from app.core.redaction import redact_url
from app.core.redis import FAST_TIMEOUT_SECONDS, make_redis
from app.core.request_context import CURRENT_REQUEST, JobRequestId
from app.core.resources import JobState
from app.core.settings import Settings
from app.queue.encoded import EncodedJob, encode_job, encode_jobs, job_kwargs, namespaced
from app.queue.errors import QueueUnavailableError
from app.queue.job import Job
from app.queue.outbox import relay_outbox, stage
from app.queue.queues import QueueName
from app.queue.serialization import deserialize, serialize

logger = logging.getLogger(__name__)


def queue_key(settings: Settings, queue: str) -> str:
    return namespaced(settings, queue)


def make_arq_redis(url: str, *, timeout: float, per_command: bool = True) -> ArqRedis:
    """An arq pool that gives up after ``timeout`` (see ``make_redis``), reading and writing JSON, never pickle."""
    redis = cast(ArqRedis, make_redis(url, timeout=timeout, per_command=per_command, client=ArqRedis))
    redis.job_serializer = serialize
    redis.job_deserializer = deserialize
    return redis


# arq's ``enqueue_job`` in one round trip: it WATCHes the job key, checks that
# neither the job nor its result exists, then MULTI/PSETEX/ZADD/EXEC (three
# round trips, and a connection pinned in between). The script does the same
# check-and-write atomically, writing the same keys with the same bytes, for
# one job or a batch (a recovery page, an outbox relay): one call however many,
# so Redis parses one command and answers one reply instead of one per job.
# Per job, KEYS: job key, result key, queue; ARGV: serialized job, expiry (ms), score, job id.
# Returns 1 (queued) or 0 (the job or its result exists) per job, in order.
_ENQUEUE_LUA = """
local queued = {}
for i = 0, #ARGV / 4 - 1 do
  local k, a = i * 3, i * 4
  if redis.call('EXISTS', KEYS[k + 1], KEYS[k + 2]) > 0 then
    queued[i + 1] = 0
  else
    redis.call('PSETEX', KEYS[k + 1], ARGV[a + 2], ARGV[a + 1])
    redis.call('ZADD', KEYS[k + 3], ARGV[a + 3], ARGV[a + 4])
    queued[i + 1] = 1
  end
end
return queued
"""


class ArqQueue:
    def __init__(self, settings: Settings, db: Database, *, timeout: float = FAST_TIMEOUT_SECONDS) -> None:
        self.settings = settings
        self.db = db
        self.timeout = timeout
        # Every call below runs under asyncio.timeout(self.timeout).
        self.redis = make_arq_redis(self.settings.require_redis_url(), timeout=timeout, per_command=False)
        self._enqueue = self.redis.register_script(_ENQUEUE_LUA)

    async def add(
        self,
        job_cls: type[Job[Any]],
        data: Any,
        *,
        retry_limit: int | None = None,
        delay: timedelta | None = None,
        deduplication_id: str | None = None,
        session: AsyncSession | None = None,
        request_id: JobRequestId = CURRENT_REQUEST,
    ) -> str | None:
        job = encode_job(
            self.settings,
            job_cls,
            data,
            retry_limit=retry_limit,
            delay=delay,
            deduplication_id=deduplication_id,
            request_id=request_id,
        )
        if session is not None:
            stage(session, job)
            return job.job_id
        (queued,) = await self.enqueue_encoded([job], what=job_cls.name())
        return queued

    async def add_many(
        self,
        job_cls: type[Job[Any]],
        items: Sequence[tuple[Any, str | None]],
        *,
        request_ids: Sequence[str | None] | None = None,
    ) -> list[str | None]:
        """``add`` for several jobs of one class (data, deduplication id) in one round trip."""
        ids: Sequence[JobRequestId] = [CURRENT_REQUEST] * len(items) if request_ids is None else request_ids
        jobs = encode_jobs(
            self.settings,
            job_cls,
            [(data, dedup, request_id) for (data, dedup), request_id in zip(items, ids, strict=True)],
        )
        return await self.enqueue_encoded(jobs, what=job_cls.name())

    async def enqueue_encoded(self, jobs: Sequence[EncodedJob], *, what: str) -> list[str | None]:
        """Queue jobs already encoded (by ``add_many``, or rebuilt from outbox rows) in one round trip.

        No job class is needed: a relay queues the jobs of modules it does not load.
        """
        if not jobs:
            return []
        keys: list[str] = []
        args: list[Any] = []
        for job in jobs:
            self._append_enqueue_call(job, keys, args)
        try:
            async with asyncio.timeout(self.timeout):
                results = await self._enqueue(keys=keys, args=args)
        except (TimeoutError, RedisError, OSError) as exc:
            raise self._unavailable(what, exc) from exc
        return [self._queued_id(job, queued) for queued, job in zip(results, jobs, strict=True)]

    async def relay_outbox(self, *, session: AsyncSession | None = None) -> int:
        async def send(jobs: list[EncodedJob]) -> None:
            await self.enqueue_encoded(jobs, what=f"{len(jobs)} staged job(s) ({_names(jobs)})")

        return await relay_outbox(self.db, send, session=session)

    def _append_enqueue_call(self, job: EncodedJob, keys: list[str], args: list[Any]) -> None:
        """Add the job's keys and arguments of ``_ENQUEUE_LUA``: what arq's ``enqueue_job`` would write."""
        envelope = serialize_job(job.name, (job.data,), job_kwargs(job), None, job.enqueued_ms, serializer=serialize)
        keys += [job_key_prefix + job.job_id, result_key_prefix + job.job_id, queue_key(self.settings, job.queue)]
        args += [envelope, job.expires_in_ms(timestamp_ms()), job.run_at_ms, job.job_id]

    def _queued_id(self, job: EncodedJob, queued: Any) -> str | None:
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

    async def state(self, deduplication_id: str) -> JobState:
        job_id = namespaced(self.settings, deduplication_id)
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.exists(in_progress_key_prefix + job_id)
                pipe.exists(job_key_prefix + job_id)
                for queue in QueueName:
                    pipe.zscore(queue_key(self.settings, queue), job_id)
                running, waiting, *scores = await asyncio.wait_for(pipe.execute(), self.timeout)
        except (TimeoutError, RedisError, OSError) as exc:
            raise QueueUnavailableError(
                f"Could not read the state of job {deduplication_id!r}: Redis did not answer within "
                f"{self.timeout:g} s ({type(exc).__name__}: {exc or 'timed out'})."
            ) from exc
        if running:
            return "in_progress"
        if not waiting:
            return "absent"
        score = next((s for s in scores if s is not None), None)
        return "deferred" if score is not None and score > timestamp_ms() else "queued"

    async def run_now(self, deduplication_id: str) -> bool:
        job_id = namespaced(self.settings, deduplication_id)
        try:
            if await asyncio.wait_for(self.redis.exists(in_progress_key_prefix + job_id), self.timeout):
                return False  # running now (arq keeps it in the queue's set until it ends)
            async with self.redis.pipeline(transaction=False) as pipe:
                for queue in QueueName:  # XX: only the set it waits in
                    pipe.zadd(queue_key(self.settings, queue), {job_id: timestamp_ms()}, xx=True, ch=True)
                changed = await asyncio.wait_for(pipe.execute(), self.timeout)
        except (TimeoutError, RedisError, OSError) as exc:
            raise self._unavailable(f"job {deduplication_id!r} (to run it now)", exc) from exc
        return any(changed)

    async def close(self) -> None:
        await self.redis.aclose(close_connection_pool=True)


def _names(jobs: Sequence[EncodedJob]) -> str:
    return ", ".join(sorted({job.name for job in jobs}))
