"""Queue drivers: arq on Redis (production) and sync (runs the job inside ``add``; for tests).

Everything written to Redis carries ``settings.redis_namespace``: the arq queue
is ``<namespace><queue name>`` and a job id is ``<namespace><deduplication id>``
(or a random id), so tests and several apps can share one Redis.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from arq.connections import ArqRedis
from arq.constants import in_progress_key_prefix, job_key_prefix, result_key_prefix
from arq.jobs import serialize_job
from arq.utils import timestamp_ms, to_ms
from redis.exceptions import RedisError

from app.core.redaction import redact_url
from app.core.redis import FAST_TIMEOUT_SECONDS
from app.queue.errors import QueueUnavailableError
from app.queue.execution import run_attempt
from app.queue.job import Job, JobContext
from app.queue.protocol import JobState, MessageQueue
from app.queue.queues import QueueName
from app.queue.retry import expires_after_seconds
from app.queue.serialization import deserialize, serialize

if TYPE_CHECKING:
    from app.core.resources import Resources
    from app.core.settings import Settings

logger = logging.getLogger("app.queue")


def queue_key(settings: Settings, queue: str) -> str:
    return f"{settings.redis_namespace}{queue}"


def make_arq_redis(url: str, *, timeout: float, per_command: bool = True) -> ArqRedis:
    """An arq pool that gives up after ``timeout``: a hung Redis cannot hang us.

    ``per_command=False``: only connecting is bounded here, for a caller that
    bounds each whole call with ``asyncio.timeout`` (see ``make_call_bounded_redis``).
    """
    redis = ArqRedis.from_url(
        url,
        socket_timeout=timeout if per_command else None,
        socket_connect_timeout=timeout,
        retry_on_timeout=False,
    )
    redis.job_serializer = serialize
    redis.job_deserializer = deserialize
    return redis


# arq's ``enqueue_job`` in one round trip: it WATCHes the job key, checks that
# neither the job nor its result exists, then MULTI/PSETEX/ZADD/EXEC (three
# round trips, and a connection pinned in between). The script does the same
# check-and-write atomically, writing the same keys with the same bytes.
# KEYS: job key, result key, queue. ARGV: serialized job, expiry (ms), score, job id.
_ENQUEUE_LUA = """
if redis.call('EXISTS', KEYS[1], KEYS[2]) > 0 then
  return 0
end
redis.call('PSETEX', KEYS[1], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[4])
return 1
"""


class ArqQueue:
    def __init__(self, resources: Resources, *, timeout: float = FAST_TIMEOUT_SECONDS) -> None:
        self.settings = resources.settings
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
    ) -> str | None:
        keys, args = self._enqueue_call(job_cls, data, retry_limit, delay, deduplication_id)
        try:
            async with asyncio.timeout(self.timeout):
                queued = await self._enqueue(keys=keys, args=args)
        except (TimeoutError, RedisError, OSError) as exc:
            raise self._unavailable(job_cls, exc) from exc
        return self._queued_id(job_cls, queued, args[3])

    async def add_many(self, job_cls: type[Job[Any]], items: Sequence[tuple[Any, str | None]]) -> list[str | None]:
        """``add`` for several jobs of one class (data, deduplication id) in one pipelined round trip."""
        if not items:
            return []
        calls = [self._enqueue_call(job_cls, data, None, None, dedup) for data, dedup in items]
        try:
            async with asyncio.timeout(self.timeout):
                async with self.redis.pipeline(transaction=False) as pipe:
                    for keys, args in calls:
                        await self._enqueue(keys=keys, args=args, client=pipe)
                    results = await pipe.execute()
        except (TimeoutError, RedisError, OSError) as exc:
            raise self._unavailable(job_cls, exc) from exc
        return [self._queued_id(job_cls, queued, args[3]) for queued, (_, args) in zip(results, calls, strict=True)]

    def _enqueue_call(
        self,
        job_cls: type[Job[Any]],
        data: Any,
        retry_limit: int | None,
        delay: timedelta | None,
        deduplication_id: str | None,
    ) -> tuple[list[str], list[Any]]:
        """The keys and arguments of ``_ENQUEUE_LUA``: what arq's ``enqueue_job`` would write."""
        raw = job_cls.encode_data(data)
        policy = job_cls.retry_policy(self.settings)
        limit = policy.retry_limit if retry_limit is None else retry_limit
        defer = delay.total_seconds() if delay else 0.0
        job_id = self.settings.redis_namespace + (deduplication_id or uuid.uuid4().hex)
        enqueued_ms = timestamp_ms()
        job = serialize_job(job_cls.name(), (raw,), {"retry_limit": limit}, None, enqueued_ms, serializer=serialize)
        keys = [job_key_prefix + job_id, result_key_prefix + job_id, queue_key(self.settings, job_cls.queue)]
        expires_ms = to_ms(expires_after_seconds(policy, limit, defer))
        return keys, [job, expires_ms, enqueued_ms + (to_ms(defer) or 0), job_id]

    def _queued_id(self, job_cls: type[Job[Any]], queued: Any, job_id: str) -> str | None:
        if not queued:
            logger.debug("%s %s is already queued or running: not queued again.", job_cls.name(), job_id)
            return None
        return job_id

    def _unavailable(self, job_cls: type[Job[Any]], exc: BaseException) -> QueueUnavailableError:
        return QueueUnavailableError(
            f"Could not queue {job_cls.name()}: Redis at {redact_url(self.settings.require_redis_url())} "
            f"did not accept it within {self.timeout:g} s ({type(exc).__name__}: {exc or 'timed out'}). "
            "The job was not queued; check that Redis is running and REDIS_URL points at it."
        )

    async def state(self, deduplication_id: str) -> JobState:
        job_id = self.settings.redis_namespace + deduplication_id
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

    async def close(self) -> None:
        await self.redis.aclose(close_connection_pool=True)


class SyncQueue:
    """Runs the job inside ``add`` with the same JSON round trip and validation as the worker.

    A failure is raised to the caller (once: no retries inline), so a test sees it.
    """

    def __init__(self, resources: Resources) -> None:
        self.resources = resources
        self._running: set[str] = set()

    async def add(
        self,
        job_cls: type[Job[Any]],
        data: Any,
        *,
        retry_limit: int | None = None,
        delay: timedelta | None = None,
        deduplication_id: str | None = None,
    ) -> str | None:
        envelope = deserialize(serialize({"a": [job_cls.encode_data(data)]}))
        job_id = self.resources.settings.redis_namespace + (deduplication_id or uuid.uuid4().hex)
        if job_id in self._running:
            return None
        policy = job_cls.retry_policy(self.resources.settings)
        limit = policy.retry_limit if retry_limit is None else retry_limit
        context = JobContext(self.resources, job_id, 1, limit, job_cls.queue)
        self._running.add(job_id)
        try:
            await run_attempt(context, job_cls, envelope["a"][0], may_retry=False)
        finally:
            self._running.discard(job_id)
        return job_id

    async def add_many(self, job_cls: type[Job[Any]], items: Sequence[tuple[Any, str | None]]) -> list[str | None]:
        return [await self.add(job_cls, data, deduplication_id=dedup) for data, dedup in items]

    async def state(self, deduplication_id: str) -> JobState:
        job_id = self.resources.settings.redis_namespace + deduplication_id
        return "in_progress" if job_id in self._running else "absent"

    async def close(self) -> None:
        return None


def create_message_queue(resources: Resources) -> MessageQueue:
    if resources.settings.message_queue_driver == "sync":
        return SyncQueue(resources)
    return ArqQueue(resources)
