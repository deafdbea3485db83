"""One try of one job, the same code for the arq worker, the sync driver and ``crons run``.

It binds the job's log context (``job_name``, ``job_id``, ``queue``, ``attempt``:
every line written while the job runs carries them, stdlib lines included),
validates the data, runs ``handle`` under the job's timeout, and on failure
logs the traceback, reports to Sentry and decides: ``RetryScheduled`` with
backoff on a non-final try, the job's own exception on the final one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import msgspec
import structlog

from app.core import tracing
from app.core.journal import caused_by
from app.core.metrics import JOB_DURATION, JOB_RUNS, child
from app.core.sentry import ignore_logger, report_exception
from app.queue.crons import run_cron_tick
from app.queue.errors import PermanentError, RetryLater, RetryScheduled
from app.queue.job import UNLIMITED_RETRIES, CronJob, CronTick, Job, JobContext
from app.queue.retry import retry_delay
from app.queue.tries import waited_without_attempt

logger = logging.getLogger(__name__)
# We report each failed try ourselves, with tags and a fingerprint: Sentry's
# logging integration must not send the same failure a second time.
ignore_logger(logger.name)

# A try cut short by a killed or stopped worker still counts (arq counts it), so
# a job can reach a try past its limit; it then runs once more, but a job that
# keeps taking its worker down stops after this many extra tries.
INTERRUPTED_TRIES_ALLOWED = 3


class JobTimeoutError(Exception):
    """A try ran past the job's ``timeout_seconds``; retried like any error."""


def _describe_tries(context: JobContext) -> str:
    if context.retry_limit >= UNLIMITED_RETRIES:
        return f"attempt {context.attempt}"
    return f"attempt {context.attempt} of {context.retry_limit + 1}"


async def run_attempt(context: JobContext, job_cls: type[Job[Any]], raw: Any, *, may_retry: bool = True) -> None:
    """Run one try; raise ``RetryScheduled`` to retry, or the job's error when the failure is final.

    With tracing on, the try is a span named after the job's class, in the trace it was queued in.
    """
    name, queue = job_cls.name(), str(context.queue_name)
    attempt = tracing.job_attempt(
        name, queue=queue, job_id=context.job_id, attempt=context.attempt, trace_context=context.trace_context
    )
    with (
        attempt,
        caused_by(name),  # the change journal's cause of what the job writes
        structlog.contextvars.bound_contextvars(
            job_name=name, job_id=context.job_id, queue=queue, attempt=context.attempt
        ),
    ):
        started = time.perf_counter()
        logger.info("Job %s started (%s).", name, _describe_tries(context))

        def is_final(exc: BaseException) -> bool:
            if not may_retry or isinstance(exc, PermanentError):
                return True
            # A wait that spends no attempt (an upstream held) is never final: the worker gives its try back.
            return context.attempt > context.retry_limit and not waited_without_attempt(exc)

        try:
            await _run_body(context, job_cls, raw, is_final)
        except asyncio.CancelledError:
            logger.warning(
                "Job %s was cancelled after %.0f ms (worker stopping): it stays queued for another worker.",
                name,
                _ms(started),
                extra={"duration_ms": _ms(started)},
            )
            raise
        except Exception as exc:
            final = is_final(exc)
            policy = job_cls.retry_policy(context.resources.settings)
            delay = None if final else retry_delay(policy, context.attempt, exc)
            _count(name, "failed" if delay is None else "retry", started)
            if delay is not None and isinstance(exc, RetryLater):
                # The remote side asked to be called later (a 429): expected, so not a fault to report.
                logger.log(
                    exc.log_level,
                    "Job %s deferred on %s: %s; tried again in %.1f s.",
                    name,
                    _describe_tries(context),
                    exc,
                    delay,
                )
            else:
                _log_and_report(context, name, exc, started, final=final, delay=delay)
            if delay is None:
                raise
            raise RetryScheduled(delay) from exc
        _count(name, "ok", started)
        logger.info("Job %s finished in %.0f ms.", name, _ms(started), extra={"duration_ms": _ms(started)})


def _count(name: str, outcome: str, started: float) -> None:
    child(JOB_RUNS, name, outcome).inc()
    child(JOB_DURATION, name).observe(time.perf_counter() - started)


async def _run_body(context: JobContext, job_cls: type[Job[Any]], raw: Any, is_final: Any) -> None:
    name = job_cls.name()
    if context.attempt > context.retry_limit + 1 + INTERRUPTED_TRIES_ALLOWED:
        raise PermanentError(
            f"{name} was interrupted on {context.attempt - context.retry_limit - 1} tries past its limit "
            "(its worker was killed or stopped each time): not run again. Look for what kills the worker "
            "while this job runs (memory, a blocked event loop), then queue the job again."
        )
    try:
        data = job_cls.decode_data(raw)
    except msgspec.ValidationError as exc:
        raise PermanentError(
            f"The queued data of {name} does not match {job_cls.data_type.__name__}: {exc}. "
            "It was queued by code that disagrees with the job's data type; it is not retried."
        ) from exc
    job = job_cls(context)
    timeout = job_cls.retry_policy(context.resources.settings).timeout_seconds

    async def body() -> None:
        try:
            async with asyncio.timeout(timeout):
                await job.handle(data)
        except TimeoutError as exc:
            raise JobTimeoutError(f"{name} did not finish within its timeout of {timeout} s.") from exc

    if isinstance(job, CronJob) and isinstance(data, CronTick):
        await run_cron_tick(context.resources.db, context.resources.settings, type(job), data, body, is_final)
    else:
        await body()


def _log_and_report(
    context: JobContext, name: str, exc: Exception, started: float, *, final: bool, delay: float | None
) -> None:
    if delay is not None:
        outcome = f"retrying in {delay:.1f} s"
    elif isinstance(exc, PermanentError):
        outcome = "final: PermanentError, not retried"
    else:
        outcome = "final: no retries left" if context.attempt > context.retry_limit else "final: not retried"
    logger.error(
        "Job %s failed on %s (%s): %s: %s",
        name,
        _describe_tries(context),
        outcome,
        type(exc).__name__,
        exc,
        exc_info=exc,
        extra={"duration_ms": _ms(started), "final": final, "retry_in_seconds": delay},
    )
    report_exception(
        exc,
        tags={
            "job_name": name,
            "attempt": context.attempt,
            "queue": str(context.queue_name),
            "final": "yes" if final else "no",
        },
        # Every try of one failing job (same job, same error type) groups into one issue.
        fingerprint=["queue-job-failure", name, type(exc).__qualname__],
    )


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 2)
