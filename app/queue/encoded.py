"""A job as the queue stores it: everything needed to queue it again without its class.

``add`` encodes a job from its class; the outbox stores the same fields in a
row and the relay rebuilds them from it. Both reach Redis through one enqueue
path, so a relayed job is byte for byte what ``add`` would have queued, with
the id fixed when it was encoded.

A job asked for now (no ``delay``) is *fair*: its place in the queue is decided
when it is written, from its tenant's turn (``app.queue.fairness``). A job with
a delay keeps its real due time.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from app.core.request_context import JobRequestId, request_id_for_job
from app.core.resources import JobOptions
from app.core.tracing import CURRENT_TRACE, JobTraceContext, current_trace_context
from app.queue.job import Job
from app.queue.retry import expires_after_seconds

if TYPE_CHECKING:
    from app.core.settings import Settings


NO_OPTIONS = JobOptions()


def now_ms() -> int:
    """The time as the queue scores and stamps jobs: epoch milliseconds."""
    return round(time.time() * 1000)


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def namespaced(settings: Settings, key: str) -> str:
    """A job id or queue name as Redis holds it: prefixed with ``REDIS_NAMESPACE`` (tests and apps share Redis)."""
    return settings.redis_namespace + key


@dataclass(frozen=True)
class EncodedJob:
    name: str
    queue: str
    # With the namespace: the id the worker sees and the queue deduplicates by.
    job_id: str
    # ``Job.encode_data``'s output: JSON builtins, validated again when the job runs.
    data: Any
    retry_limit: int
    # When it is due (epoch ms): the queue's score; a relay after an outage does not delay it again.
    run_at_ms: int
    # How long after ``run_at_ms`` the queue keeps it, so it survives every retry.
    expires_after_ms: int
    enqueued_ms: int
    # The request it was queued for (``X-Request-Id``): every line the job writes carries it.
    request_id: str | None = None
    # Whose work it is (a workspace, a Stripe customer): tenants of one queue are served in turn.
    tenant_key: str | None = None
    # Placed by its tenant's turn (asked for now), or at ``run_at_ms`` (a delay, or a queue served by time).
    fair: bool = False
    # The trace it continues (tracing on): W3C headers as JSON, by default those of the code that queued it.
    trace_context: str | None = None

    def expires_in_ms(self, now_ms: int) -> int:
        """The lifetime to give the job's key when it is written at ``now_ms``."""
        return max(self.run_at_ms - now_ms, 0) + self.expires_after_ms


def encode_job(settings: Settings, job_cls: type[Job[Any]], data: Any, options: JobOptions = NO_OPTIONS) -> EncodedJob:
    """Validate ``data`` against the job's type (``TypeError`` if it is not one) and fix the job's id and times.

    ``options``: as ``MessageQueue.add``'s keywords (by default the request, tenant and trace are the caller's).
    """
    (job,) = encode_jobs(
        settings,
        job_cls,
        [(data, options.deduplication_id, options.request_id)],
        retry_limit=options.retry_limit,
        delay=options.delay,
        tenant_keys=[options.tenant_key],
        trace_contexts=[options.trace_context],
    )
    return job


def encode_jobs(
    settings: Settings,
    job_cls: type[Job[Any]],
    items: Sequence[tuple[Any, str | None, JobRequestId]],
    *,
    retry_limit: int | None = None,
    delay: timedelta | None = None,
    tenant_keys: Sequence[str | None] | None = None,
    trace_contexts: Sequence[JobTraceContext] | None = None,
) -> list[EncodedJob]:
    """``encode_job`` for several jobs of one class, each (data, deduplication id, request id).

    The class's retry policy and the lifetime it gives a job are worked out once
    for all of them (the recovery cron queues pages of 500). ``tenant_keys``:
    each job's, in the order of ``items`` (None: the class's ``tenant_field``);
    ``trace_contexts``: each job's too (by default the running span's).
    """
    policy = job_cls.retry_policy(settings)
    limit = policy.retry_limit if retry_limit is None else retry_limit
    expires_after_ms = _ms(expires_after_seconds(policy, limit, 0.0))
    name, queue, now = job_cls.name(), str(job_cls.queue), now_ms()
    run_at_ms = now + (_ms(delay.total_seconds()) if delay is not None else 0)
    fair = delay is None and job_cls.fair
    keys = tenant_keys if tenant_keys is not None else [None] * len(items)
    current = current_trace_context()
    traces = [current] * len(items) if trace_contexts is None else [_trace(each, current) for each in trace_contexts]
    jobs = []
    for (data, deduplication_id, request_id), tenant_key, trace in zip(items, keys, traces, strict=True):
        encoded = job_cls.encode_data(data)
        jobs.append(
            EncodedJob(
                name=name,
                queue=queue,
                job_id=namespaced(settings, deduplication_id or uuid.uuid4().hex),
                data=encoded,
                retry_limit=limit,
                run_at_ms=run_at_ms,
                expires_after_ms=expires_after_ms,
                enqueued_ms=now,
                request_id=request_id_for_job(request_id),
                tenant_key=tenant_key if tenant_key is not None else job_cls.tenant_of(encoded),
                fair=fair,
                trace_context=trace,
            )
        )
    return jobs


def _trace(choice: JobTraceContext, current: str | None) -> str | None:
    return current if choice is CURRENT_TRACE else choice


def job_kwargs(job: EncodedJob) -> dict[str, Any]:
    """What travels beside the data in the queue's envelope (and arrives as the job function's keywords)."""
    kwargs: dict[str, Any] = {"retry_limit": job.retry_limit}
    if job.request_id:
        kwargs["request_id"] = job.request_id
    if job.trace_context:
        kwargs["trace_context"] = job.trace_context
    return kwargs
