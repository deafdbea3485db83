"""One ``arq.Worker`` per queue, wired to our job layer.

arq handles one queue per Worker, pickles by default, retries nothing but
``Retry``, keeps results for an hour and logs every job twice over ours; this
module builds Workers that use JSON, keep no result (a finished job's
deduplication id is free at once), leave retries to ``run_attempt``, and turn a
job of a module that is not loaded into one clear error.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

import structlog
from arq.constants import in_progress_key_prefix, retry_key_prefix
from arq.utils import timestamp_ms
from arq.worker import Function, Retry, Worker, func

from app.core.request_context import bound_request_id
from app.core.sentry import report_exception
from app.queue.arq_driver import make_arq_redis, queue_key
from app.queue.errors import RetryLater, UnknownJobError
from app.queue.execution import run_attempt
from app.queue.job import Job, JobContext
from app.queue.registry import JobRegistry
from app.queue.serialization import deserialize, serialize

if TYPE_CHECKING:
    from app.core.resources import Resources

logger = logging.getLogger(__name__)

# Our own timeout (Job.retry_policy().timeout_seconds) ends a try as a retried
# error; arq's, a little later, is only the backstop for a job that ignores
# cancellation. The in-progress key lives arq's timeout + 10 s: that bounds how
# long a SIGKILLed worker's job waits before another worker runs it again.
ARQ_TIMEOUT_MARGIN_SECONDS = 2
ARQ_IN_PROGRESS_EXTRA_SECONDS = 10
# Tries are limited per job (the retry_limit travelling with it), not by arq.
ARQ_MAX_TRIES = 1_000_000
WORKER_REDIS_TIMEOUT_SECONDS = 5.0
HEALTH_CHECK_INTERVAL_SECONDS = 60


def arq_function(job_cls: type[Job[Any]], resources: Resources) -> Function:
    policy = job_cls.retry_policy(resources.settings)

    async def run(ctx: dict[str, Any], raw: Any, retry_limit: int | None = None, request_id: str | None = None) -> None:
        limit = policy.retry_limit if retry_limit is None else retry_limit
        context = JobContext(resources, ctx["job_id"], ctx["job_try"], limit, job_cls.queue)
        with bound_request_id(request_id):
            try:
                await run_attempt(context, job_cls, raw)
            except Retry as retry:
                deferral = retry.__cause__
                if isinstance(deferral, RetryLater) and not deferral.counts_as_try:
                    due_ms = timestamp_ms() + (retry.defer_score or 0)
                    await _wait_for_turn(ctx["redis"], ctx["job_id"], turns_key(resources, job_cls.queue), due_ms)
                raise

    run.__qualname__ = job_cls.name()
    return func(
        run,
        name=job_cls.name(),
        keep_result=0,
        timeout=policy.timeout_seconds + ARQ_TIMEOUT_MARGIN_SECONDS,
        max_tries=ARQ_MAX_TRIES,
    )


# A job that waits for a turn it holds (``RetryLater.counts_as_try`` False: a Stripe read parked until its turn of
# the budget) has not tried: arq's count of its tries (``arq:retry:<job id>``, INCR at each start, dropped when the
# job ends) is given back, a DECR, at most MAX_TRIES_GIVEN_BACK times per job (counted beside it, kept as long).
# And its turn is noted in the queue's turns set, so that a worker starts it when the turn comes (``_PICK_LUA``)
# instead of behind every job that was due before it.
MAX_TRIES_GIVEN_BACK = 100
_WAIT_FOR_TURN_LUA = """
local given = redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], 88400)
if given <= tonumber(ARGV[1]) then
  redis.call('DECR', KEYS[1])
end
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[3])
return given
"""


def turns_key(resources: Resources, queue: str) -> str:
    """The sorted set of a queue's jobs waiting for a turn (scores: when, epoch ms)."""
    return queue_key(resources.settings, queue) + ":turns"


async def _wait_for_turn(redis: Any, job_id: str, turns: str, due_ms: int) -> None:
    keys = [retry_key_prefix + job_id, f"{retry_key_prefix}{job_id}:given-back", turns]
    await redis.eval(_WAIT_FOR_TURN_LUA, len(keys), *keys, MAX_TRIES_GIVEN_BACK, due_ms, job_id)


def rerun_after_kill_seconds(job_cls: type[Job[Any]], resources: Resources) -> int:
    """Upper bound of how long a job of a SIGKILLed worker waits before it runs again (plus one poll)."""
    timeout = job_cls.retry_policy(resources.settings).timeout_seconds
    return timeout + ARQ_TIMEOUT_MARGIN_SECONDS + ARQ_IN_PROGRESS_EXTRA_SECONDS


def _unknown_job(name: str, queue: str) -> Function:
    async def refuse(ctx: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        with structlog.contextvars.bound_contextvars(
            job_name=name, job_id=ctx["job_id"], queue=queue, attempt=ctx["job_try"]
        ):
            exc = UnknownJobError(
                f"Job {name} (id {ctx['job_id']}) was queued on {queue}, but no module this worker loads "
                f"defines it: its module is not listed in app/runtime.py (WORKER_MODULES). "
                "The job was dropped: list the module there, restart the workers and queue it again."
            )
            logger.error("%s", exc)
            report_exception(exc, tags={"job_name": name, "queue": queue}, fingerprint=["unknown-job", name])
            raise exc

    return func(refuse, name=name, keep_result=0, max_tries=ARQ_MAX_TRIES)


class _Functions(dict[str, Any]):
    """arq looks a job's function up by name here: an unknown name gets the refusing function."""

    def __init__(self, functions: dict[str, Any], queue: str) -> None:
        super().__init__(functions)
        self.queue = queue

    def __missing__(self, name: str) -> Function:
        return _unknown_job(name, self.queue)


# The due jobs of a queue that no worker runs (no in-progress key), at most ARGV[4] of them, looked for among the
# first ARGV[2] (arq keeps a running job in the queue until it ends): first those whose turn has come (KEYS[2],
# see _WAIT_FOR_TURN_LUA; an entry is dropped once its job is started, gone or deferred again), then the oldest.
_PICK_LUA = """
local now, wanted = tonumber(ARGV[1]), tonumber(ARGV[4])
local picked, taken = {}, {}
local function free(id)
  return not taken[id] and redis.call('EXISTS', ARGV[3] .. id) == 0
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, ARGV[2])) do
  if #picked >= wanted then break end
  local score = tonumber(redis.call('ZSCORE', KEYS[1], id))
  redis.call('ZREM', KEYS[2], id)
  if score and score <= now and free(id) then
    picked[#picked + 1] = id
    taken[id] = true
  end
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, ARGV[2])) do
  if #picked >= wanted then break end
  if free(id) then
    picked[#picked + 1] = id
    taken[id] = true
  end
end
return picked
"""


class _QueueWorker(Worker):
    """arq's Worker, passing over the jobs already running when it looks for jobs to start.

    arq keeps a running job in the queue's sorted set until it ends, and checks
    each id a poll reads with round trips of its own (WATCH, EXISTS, ZSCORE),
    waiting for a free slot between them. When the oldest jobs run long (a
    Stripe backlog waiting its turn in the API budget), every slot that freed
    cost dozens of those for jobs already running: most of a worker's CPU, while
    the jobs behind them waited. One script call instead reads the due jobs
    that are not running, no more than the free slots; arq's own check still
    guards each start (another worker may take one in between).

    A job whose turn has come (a Stripe read parked until its turn of the
    budget) starts before the oldest due jobs: it would otherwise wait behind
    the backlog it left, and its turn pass unused. Every other job starts
    oldest first, as arq starts them.

    ``_poll_iteration`` is arq 0.28.0's (pinned in constraints.txt) but for that.
    """

    _pick: Any = None

    async def _poll_iteration(self) -> None:
        count = self.queue_read_limit
        if self.burst and self.max_burst_jobs >= 0:
            burst_jobs_remaining = self.max_burst_jobs - self._jobs_started()
            if burst_jobs_remaining < 1:
                return
            count = min(burst_jobs_remaining, count)
        if self.allow_pick_jobs and self.job_counter < self.max_jobs:
            await self.start_jobs(await self._due_not_running(count))
        if self.allow_abort_jobs:
            await self._cancel_aborted_jobs()
        for job_id, task in list(self.tasks.items()):
            if task.done():
                del self.tasks[job_id]
                task.result()  # as arq does: an error of its own job handling is raised here
        await self.heart_beat()

    async def _due_not_running(self, count: int) -> list[bytes]:
        if self._pick is None:
            self._pick = self.pool.register_script(_PICK_LUA)
        free = min(count, self.max_jobs - self.job_counter)
        args = [timestamp_ms(), count, in_progress_key_prefix, free]
        picked: list[bytes] = await self._pick(keys=[self.queue_name, f"{self.queue_name}:turns"], args=args)
        return picked


class _QuietArqLines(logging.Filter):
    """Drop arq's own per-job failure line: ours (with context, traceback and Sentry report) replaces it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith("%6.2fs ! %s failed"))


def quiet_arq_logs() -> None:
    arq_logger = logging.getLogger("arq.worker")
    # arq's start/end/retry lines (INFO) repeat ours without the job context.
    arq_logger.setLevel(max(logging.WARNING, logging.getLogger().getEffectiveLevel()))
    if not any(isinstance(f, _QuietArqLines) for f in arq_logger.filters):
        arq_logger.addFilter(_QuietArqLines())


def build_arq_worker(
    queue: str,
    registry: JobRegistry,
    resources: Resources,
    *,
    burst: bool,
    on_startup: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
) -> Worker:
    """Must run inside the event loop (arq binds the running loop at construction)."""
    settings = resources.settings
    functions = [arq_function(job_cls, resources) for job_cls in registry.jobs_on(queue)]
    worker = _QueueWorker(
        functions,
        queue_name=queue_key(settings, queue),
        redis_pool=make_arq_redis(settings.require_redis_url(), timeout=WORKER_REDIS_TIMEOUT_SECONDS),
        burst=burst,
        handle_signals=False,
        max_jobs=settings.worker_max_jobs,
        keep_result=0,
        poll_delay=settings.worker_poll_delay_seconds,
        max_tries=ARQ_MAX_TRIES,
        health_check_interval=HEALTH_CHECK_INTERVAL_SECONDS,
        ctx={"resources": resources},
        job_serializer=serialize,
        job_deserializer=deserialize,
        on_startup=cast(Any, on_startup),
        log_results=False,
    )
    worker.functions = _Functions(worker.functions, queue)
    return worker
