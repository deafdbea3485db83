"""The one place that knows arq's Redis layout: its queues, its job keys and states, checked against arq's own API.

Nothing else reads or writes arq's keys: the driver queues jobs and asks a
job's state here, ``/ops`` counts a queue's jobs (``queued_count``) and the
worker's start-up check looks at the first of them (``peek``). The worker runs
a stock ``arq.Worker`` (``app.worker.arq_worker``) through arq's public
interface. Jobs are written by a script of our own, for one measured gain (bench/README.md, "The arq
adapter"): ``ArqRedis.enqueue_job`` costs three round trips per job (WATCH,
EXISTS, MULTI/EXEC) and a pinned connection, and a recovery page or an outbox
relay queues hundreds; a job placed by its tenant's turn would cost a fourth.
The script writes what ``enqueue_job`` writes, the same keys with the same
bytes (the envelope is arq's own ``serialize_job``), for one job or many, and
places fair jobs by ``app.queue.fairness`` in the same call.

``tests/queue/test_arq_adapter.py`` checks it against the installed arq: a job
written here is read back by ``arq.jobs.Job(...).info()`` and ``status()`` and
run by a stock ``Worker``, what is counted and peeked here is what arq queued
and runs, and the test fails, naming this module, when the
installed arq is not ``CHECKED_ARQ_VERSION``. arq is in maintenance mode:
re-check this file against its ``connections.py`` before changing the pin.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

from arq.connections import ArqRedis
from arq.constants import job_key_prefix, result_key_prefix
from arq.jobs import Job as ArqJob
from arq.jobs import JobStatus, serialize_job

from app.core.redis import LuaScript
from app.queue.encoded import EncodedJob, job_kwargs, namespaced
from app.queue.fairness import ANONYMOUS_TENANT, HORIZON_MS, PLACE_BY_TURN_LUA, turns_key
from app.queue.serialization import deserialize, serialize

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from app.core.resources import JobState
    from app.core.settings import Settings

CHECKED_ARQ_VERSION = "0.28.0"
"""The arq release whose ``ArqRedis.enqueue_job`` this module was checked against (constraints.txt pins it)."""

DISPATCH_FUNCTION = "job"
"""The arq function every queued job names: the worker's one function per queue, which runs the job class named
in the job's first argument (so a job of a module the worker does not load gets a clear error of ours)."""

# What enqueue_job does per job (arq 0.28.0, connections.py): nothing if the job key or the result key exists,
# else PSETEX the job key (its lifetime in ms) and ZADD the job id to the queue at its score. Per job,
# KEYS: job key, result key, queue, the queue's turns; ARGV (after now and the horizon): envelope, lifetime,
# score ('' for a job placed by its tenant's turn), tenant, job id. Returns 1 (queued) or 0 per job, in order.
_ENQUEUE_LUA = (
    PLACE_BY_TURN_LUA
    + """
local now, horizon = tonumber(ARGV[1]), tonumber(ARGV[2])
local queued = {}
for i = 0, #KEYS / 4 - 1 do
  local k, a = i * 4, 2 + i * 5
  if redis.call('EXISTS', KEYS[k + 1], KEYS[k + 2]) > 0 then
    queued[i + 1] = 0
  else
    local score = tonumber(ARGV[a + 3])
    if not score then
      score = place_by_turn(KEYS[k + 3], KEYS[k + 4], ARGV[a + 4], now, horizon)
    end
    redis.call('PSETEX', KEYS[k + 1], ARGV[a + 2], ARGV[a + 1])
    redis.call('ZADD', KEYS[k + 3], score, ARGV[a + 5])
    queued[i + 1] = 1
  end
end
return queued
"""
)


_STATES: dict[JobStatus, JobState] = {
    JobStatus.queued: "queued",
    JobStatus.deferred: "deferred",
    JobStatus.in_progress: "in_progress",
    JobStatus.complete: "absent",  # finished: its id is free (no result is kept)
    JobStatus.not_found: "absent",
}


def queue_key(settings: Settings, queue: str) -> str:
    """The queue as arq names it in Redis (its sorted set of job ids, due and deferred): the namespaced name."""
    return namespaced(settings, queue)


def installed_arq_version() -> str:
    return version("arq")


def version_mismatch() -> str | None:
    """None when the installed arq is the one this adapter was checked against, else what to do about it."""
    installed = installed_arq_version()
    if installed == CHECKED_ARQ_VERSION:
        return None
    return (
        f"arq {installed} is installed, but app/queue/arq_adapter.py writes arq's keys as arq "
        f"{CHECKED_ARQ_VERSION} does. Compare arq's ArqRedis.enqueue_job and Job with the adapter, run "
        "tests/queue/test_arq_adapter.py, then set CHECKED_ARQ_VERSION (and constraints.txt) to the new version."
    )


def envelope(job: EncodedJob) -> bytes:
    """The job as arq stores it: arq's own ``serialize_job`` of the dispatch function, the class name and data."""
    args = (job.name, job.data)
    return serialize_job(DISPATCH_FUNCTION, args, job_kwargs(job), None, job.enqueued_ms, serializer=serialize)


class ArqEnqueuer:
    """Queues encoded jobs on their queues (``queue_key``) in one script call."""

    def __init__(self, redis: ArqRedis, settings: Settings) -> None:
        self._script = LuaScript(redis, _ENQUEUE_LUA)
        self._settings = settings

    async def enqueue(self, jobs: Sequence[EncodedJob], now_ms: int) -> list[bool]:
        """Per job, in order: queued (True) or already waiting, running or kept as a result (False)."""
        keys: list[str] = []
        args: list[Any] = [now_ms, HORIZON_MS]
        for job in jobs:
            queue = queue_key(self._settings, job.queue)
            keys += [job_key_prefix + job.job_id, result_key_prefix + job.job_id, queue, turns_key(queue)]
            score = "" if job.fair else job.run_at_ms
            args += [envelope(job), job.expires_in_ms(now_ms), score, job.tenant_key or ANONYMOUS_TENANT, job.job_id]
        return [bool(queued) for queued in await self._script(keys=keys, args=args)]


async def job_state(redis: Redis, settings: Settings, job_id: str, queue: str) -> JobState:
    """Whether the job waits on ``queue`` (due or deferred), runs, or is absent (finished or never queued)."""
    job = ArqJob(job_id, redis, _queue_name=queue_key(settings, queue))
    return _STATES[await job.status()]


async def queued_count(redis: Redis, settings: Settings, queue: str) -> int:
    """Jobs waiting on ``queue``, due or deferred (running ones have left it)."""
    return int(await redis.zcard(queue_key(settings, queue)))


async def peek(redis: Redis, settings: Settings, queue: str, count: int) -> list[str | None]:
    """The class names of the first ``count`` jobs on ``queue``, soonest due first.

    ``None`` for a job whose stored envelope could not be read; a job gone since the queue was read is left out.
    """
    key = queue_key(settings, queue)
    names: list[str | None] = []
    for job_id in await redis.zrange(key, 0, count - 1):
        job = ArqJob(job_id.decode(), redis, _queue_name=key, _deserializer=deserialize)
        try:
            info = await job.info()
        except Exception:
            names.append(None)
            continue
        if info is not None and info.args:
            names.append(str(info.args[0]))  # the job's class name (its arq function is the dispatch function)
    return names
