"""Queue drivers: arq on Redis (production) and sync (runs the job inside ``add``; for tests).

Everything written to Redis carries ``settings.redis_namespace``: the arq queue
is ``<namespace><queue name>`` and a job id is ``<namespace><deduplication id>``
(or a random id), so tests and several apps can share one Redis.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from arq.connections import ArqRedis
from arq.constants import in_progress_key_prefix, job_key_prefix, result_key_prefix
from arq.jobs import serialize_job
from arq.utils import timestamp_ms
from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.redaction import redact_url
from app.core.redis import FAST_TIMEOUT_SECONDS
from app.queue.encoded import EncodedJob, encode_job
from app.queue.errors import QueueUnavailableError, UnknownJobError
from app.queue.execution import run_attempt
from app.queue.job import Job, JobContext
from app.queue.outbox import relay_outbox, stage
from app.queue.protocol import JobState, MessageQueue
from app.queue.queues import QueueName
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
        self.db = resources.db
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
    ) -> str | None:
        job = encode_job(
            self.settings, job_cls, data, retry_limit=retry_limit, delay=delay, deduplication_id=deduplication_id
        )
        if session is not None:
            stage(session, job)
            return job.job_id
        keys, args = self._enqueue_call(job)
        try:
            async with asyncio.timeout(self.timeout):
                queued = await self._enqueue(keys=keys, args=args)
        except (TimeoutError, RedisError, OSError) as exc:
            raise self._unavailable(job_cls.name(), exc) from exc
        return self._queued_id(job, queued)

    async def add_many(self, job_cls: type[Job[Any]], items: Sequence[tuple[Any, str | None]]) -> list[str | None]:
        """``add`` for several jobs of one class (data, deduplication id) in one pipelined round trip."""
        jobs = [encode_job(self.settings, job_cls, data, deduplication_id=dedup) for data, dedup in items]
        return await self.enqueue_encoded(jobs, what=job_cls.name())

    async def enqueue_encoded(self, jobs: Sequence[EncodedJob], *, what: str) -> list[str | None]:
        """Queue jobs already encoded (by ``add_many``, or rebuilt from outbox rows) in one round trip.

        No job class is needed: a relay queues the jobs of modules it does not load.
        """
        if not jobs:
            return []
        calls = [self._enqueue_call(job) for job in jobs]
        try:
            async with asyncio.timeout(self.timeout):
                async with self.redis.pipeline(transaction=False) as pipe:
                    for keys, args in calls:
                        await self._enqueue(keys=keys, args=args, client=pipe)
                    results = await pipe.execute()
        except (TimeoutError, RedisError, OSError) as exc:
            raise self._unavailable(what, exc) from exc
        return [self._queued_id(job, queued) for queued, job in zip(results, jobs, strict=True)]

    async def relay_outbox(self, *, session: AsyncSession | None = None) -> int:
        async def send(jobs: list[EncodedJob]) -> None:
            await self.enqueue_encoded(jobs, what=f"{len(jobs)} staged job(s) ({_names(jobs)})")

        return await relay_outbox(self.db, send, session=session)

    def _enqueue_call(self, job: EncodedJob) -> tuple[list[str], list[Any]]:
        """The keys and arguments of ``_ENQUEUE_LUA``: what arq's ``enqueue_job`` would write."""
        envelope = serialize_job(
            job.name, (job.data,), {"retry_limit": job.retry_limit}, None, job.enqueued_ms, serializer=serialize
        )
        keys = [job_key_prefix + job.job_id, result_key_prefix + job.job_id, queue_key(self.settings, job.queue)]
        return keys, [envelope, job.expires_in_ms(timestamp_ms()), job.run_at_ms, job.job_id]

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

    A failure is raised to the caller (once: no retries inline), so a test sees
    it. ``add(..., session=...)`` stages the job as the arq driver does;
    :meth:`relay_outbox` then runs the staged jobs inline.
    """

    def __init__(self, resources: Resources) -> None:
        self.resources = resources
        self._running: set[str] = set()
        # Staged rows name their job: the classes of the loaded modules, and any staged through this queue.
        self._classes: dict[str, type[Job[Any]]] = {
            job_cls.name(): job_cls for module in resources.modules for job_cls in [*module.jobs, *module.crons]
        }

    async def add(
        self,
        job_cls: type[Job[Any]],
        data: Any,
        *,
        retry_limit: int | None = None,
        delay: timedelta | None = None,
        deduplication_id: str | None = None,
        session: AsyncSession | None = None,
    ) -> str | None:
        job = encode_job(
            self.resources.settings,
            job_cls,
            data,
            retry_limit=retry_limit,
            delay=delay,
            deduplication_id=deduplication_id,
        )
        if session is not None:
            self._classes.setdefault(job.name, job_cls)
            stage(session, job)
            return job.job_id
        return await self._run(job_cls, job)

    async def add_many(self, job_cls: type[Job[Any]], items: Sequence[tuple[Any, str | None]]) -> list[str | None]:
        return [await self.add(job_cls, data, deduplication_id=dedup) for data, dedup in items]

    async def relay_outbox(self, *, session: AsyncSession | None = None) -> int:
        """Run the staged jobs inline and delete their rows; the first failure is raised after all ran."""
        failures: list[Exception] = []

        async def send(jobs: list[EncodedJob]) -> None:
            for job in jobs:
                try:
                    await self._run(self._class_of(job), job)
                except Exception as exc:
                    failures.append(exc)

        relayed = await relay_outbox(self.resources.db, send, session=session)
        if failures:
            raise failures[0]
        return relayed

    async def _run(self, job_cls: type[Job[Any]], job: EncodedJob) -> str | None:
        if job.job_id in self._running:
            return None
        envelope = deserialize(serialize({"a": [job.data]}))
        context = JobContext(self.resources, job.job_id, 1, job.retry_limit, job_cls.queue)
        self._running.add(job.job_id)
        try:
            await run_attempt(context, job_cls, envelope["a"][0], may_retry=False)
        finally:
            self._running.discard(job.job_id)
        return job.job_id

    def _class_of(self, job: EncodedJob) -> type[Job[Any]]:
        job_cls = self._classes.get(job.name)
        if job_cls is None:
            raise UnknownJobError(
                f"Staged job {job.name} (id {job.job_id}) names a class no module of this process loads: "
                "it was dropped. List its module in the modules this process opens its resources with."
            )
        return job_cls

    async def state(self, deduplication_id: str) -> JobState:
        job_id = self.resources.settings.redis_namespace + deduplication_id
        return "in_progress" if job_id in self._running else "absent"

    async def close(self) -> None:
        return None


def _names(jobs: Sequence[EncodedJob]) -> str:
    return ", ".join(sorted({job.name for job in jobs}))


def create_message_queue(resources: Resources) -> MessageQueue:
    if resources.settings.message_queue_driver == "sync":
        return SyncQueue(resources)
    return ArqQueue(resources)
