"""One stock ``arq.Worker`` per queue, built from its public arguments, running our job layer.

arq handles one queue per Worker, pickles by default, retries nothing but
``Retry``, keeps results for an hour and logs every job twice over ours. Each
Worker here is arq's own, given JSON, no kept result (a finished job's
deduplication id is free at once), our retries (``run_attempt``'s
``RetryScheduled``, handed to arq as its ``Retry``) and one
function: every job names ``DISPATCH_FUNCTION`` and carries its class name, so
the function runs the class this worker loads, or says clearly that it loads
none by that name. A try that was only a wait (an upstream held) is given back
(``app.queue.tries``): arq counts it, the job's attempt does not.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

import structlog
from arq.connections import ArqRedis
from arq.worker import Function, Retry, Worker, func

from app.core.request_context import bound_request_id
from app.core.sentry import report_exception
from app.queue.arq_adapter import DISPATCH_FUNCTION, queue_key
from app.queue.errors import RetryScheduled, UnknownJobError
from app.queue.execution import run_attempt
from app.queue.job import UNLIMITED_RETRIES, Job, JobContext
from app.queue.queues import poll_delay
from app.queue.registry import JobRegistry
from app.queue.serialization import deserialize, serialize
from app.queue.tries import GivenBackTries, waited_without_attempt

if TYPE_CHECKING:
    from app.core.resources import Resources

logger = logging.getLogger(__name__)

# Our own timeout (Job.retry_policy().timeout_seconds) ends a try as a retried
# error; arq's, a little later, is only the backstop for a job that ignores
# cancellation. arq keeps a running job's in-progress key for its largest
# function timeout + 10 s: that bounds how long a SIGKILLed worker's job waits
# before another worker runs it again.
ARQ_TIMEOUT_MARGIN_SECONDS = 2
ARQ_IN_PROGRESS_EXTRA_SECONDS = 10
WORKER_REDIS_TIMEOUT_SECONDS = 5.0
HEALTH_CHECK_INTERVAL_SECONDS = 60


def queue_timeout_seconds(jobs: list[type[Job[Any]]], resources: Resources) -> int:
    """arq's time limit of the queue's function: the longest of its jobs' own, plus a margin."""
    longest = max((job_cls.retry_policy(resources.settings).timeout_seconds for job_cls in jobs), default=0)
    return longest + ARQ_TIMEOUT_MARGIN_SECONDS


def rerun_after_kill_seconds(jobs: list[type[Job[Any]]], resources: Resources) -> int:
    """Upper bound of how long a job of a SIGKILLed worker waits before it runs again (plus one poll)."""
    return queue_timeout_seconds(jobs, resources) + ARQ_IN_PROGRESS_EXTRA_SECONDS


def dispatch_function(queue: str, registry: JobRegistry, resources: Resources) -> Function:
    """The queue's one arq function: runs the job class its first argument names."""
    jobs = {job_cls.name(): job_cls for job_cls in registry.jobs_on(queue)}
    limits = {name: job_cls.retry_policy(resources.settings).retry_limit for name, job_cls in jobs.items()}
    tries = GivenBackTries(resources.redis, resources.settings.redis_namespace)

    async def run(
        ctx: dict[str, Any],
        name: str,
        raw: Any,
        retry_limit: int | None = None,
        request_id: str | None = None,
        trace_context: str | None = None,
    ) -> None:
        job_cls = jobs.get(name)
        if job_cls is None:
            _refuse_unknown(name, queue, ctx)
            return
        limit = limits[name] if retry_limit is None else retry_limit
        job_id, given_back = ctx["job_id"], 0
        if ctx["job_try"] > 1:
            given_back = await tries.count(job_id)
        context = JobContext(resources, job_id, max(1, ctx["job_try"] - given_back), limit, queue, trace_context)
        with bound_request_id(request_id):
            try:
                await run_attempt(context, job_cls, raw)
            except RetryScheduled as retry:
                if waited_without_attempt(retry):
                    await tries.give_back(job_id)
                raise Retry(defer=retry.after_seconds) from retry
            except Exception:
                pass  # a final failure, logged and reported by run_attempt: arq need not log it again
        if given_back:
            await tries.forget(job_id)

    run.__qualname__ = f"run job of {queue}"
    timeout = queue_timeout_seconds(list(jobs.values()), resources)
    # arq's own count of tries stops no job: each job's retry_limit, travelling with it, does (run_attempt).
    return func(run, name=DISPATCH_FUNCTION, keep_result=0, timeout=timeout, max_tries=UNLIMITED_RETRIES)


def _refuse_unknown(name: str, queue: str, ctx: dict[str, Any]) -> None:
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


def quiet_arq_logs() -> None:
    """arq's start, end and retry lines (INFO) repeat ours without the job's context: warnings and errors only."""
    arq_logger = logging.getLogger("arq.worker")
    arq_logger.setLevel(max(logging.WARNING, logging.getLogger().getEffectiveLevel()))


def build_arq_worker(
    queue: str,
    registry: JobRegistry,
    resources: Resources,
    pool: ArqRedis,
    *,
    burst: bool,
    on_startup: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
) -> Worker:
    """Must run inside the event loop (arq binds the running loop at construction). ``pool`` stays the caller's."""
    settings = resources.settings
    return Worker(
        [dispatch_function(queue, registry, resources)],
        queue_name=queue_key(settings, queue),
        redis_pool=pool,
        burst=burst,
        handle_signals=False,
        job_completion_wait=settings.worker_shutdown_grace_seconds,
        max_jobs=settings.worker_max_jobs,
        keep_result=0,
        poll_delay=poll_delay(queue, settings.worker_poll_delay_seconds),
        max_tries=UNLIMITED_RETRIES,
        health_check_interval=HEALTH_CHECK_INTERVAL_SECONDS,
        ctx={"resources": resources},
        job_serializer=serialize,
        job_deserializer=deserialize,
        on_startup=cast(Any, on_startup),
        log_results=False,
    )
