"""A job as the queue stores it: everything needed to queue it again without its class.

``add`` encodes a job from its class; the outbox stores the same fields in a
row and the relay rebuilds them from it. Both reach Redis through one enqueue
path, so a relayed job is byte for byte what ``add`` would have queued, with
the id fixed when it was encoded.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from arq.utils import timestamp_ms, to_ms

from app.core.request_context import CURRENT_REQUEST, JobRequestId, request_id_for_job
from app.queue.job import Job
from app.queue.retry import expires_after_seconds

if TYPE_CHECKING:
    from app.core.settings import Settings


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

    def expires_in_ms(self, now_ms: int) -> int:
        """The lifetime to give the job's key when it is written at ``now_ms``."""
        return max(self.run_at_ms - now_ms, 0) + self.expires_after_ms


def encode_job(
    settings: Settings,
    job_cls: type[Job[Any]],
    data: Any,
    *,
    retry_limit: int | None = None,
    delay: timedelta | None = None,
    deduplication_id: str | None = None,
    request_id: JobRequestId = CURRENT_REQUEST,
) -> EncodedJob:
    """Validate ``data`` against the job's type (``TypeError`` if it is not one) and fix the job's id and times.

    ``request_id``: the request the job is for (every line it writes carries it); by default the one queuing it.
    """
    (job,) = encode_jobs(
        settings, job_cls, [(data, deduplication_id, request_id)], retry_limit=retry_limit, delay=delay
    )
    return job


def encode_jobs(
    settings: Settings,
    job_cls: type[Job[Any]],
    items: Sequence[tuple[Any, str | None, JobRequestId]],
    *,
    retry_limit: int | None = None,
    delay: timedelta | None = None,
) -> list[EncodedJob]:
    """``encode_job`` for several jobs of one class, each (data, deduplication id, request id).

    The class's retry policy and the lifetime it gives a job are worked out once
    for all of them (the recovery cron queues pages of 500).
    """
    policy = job_cls.retry_policy(settings)
    limit = policy.retry_limit if retry_limit is None else retry_limit
    expires_after_ms = to_ms(expires_after_seconds(policy, limit, 0.0))
    name, queue, now = job_cls.name(), str(job_cls.queue), timestamp_ms()
    run_at_ms = now + (to_ms(delay) or 0)
    return [
        EncodedJob(
            name=name,
            queue=queue,
            job_id=namespaced(settings, deduplication_id or uuid.uuid4().hex),
            data=job_cls.encode_data(data),
            retry_limit=limit,
            run_at_ms=run_at_ms,
            expires_after_ms=expires_after_ms,
            enqueued_ms=now,
            request_id=request_id_for_job(request_id),
        )
        for data, deduplication_id, request_id in items
    ]


def job_kwargs(job: EncodedJob) -> dict[str, Any]:
    """What travels beside the data in the queue's envelope (and arrives as the job function's keywords)."""
    kwargs: dict[str, Any] = {"retry_limit": job.retry_limit}
    if job.request_id:
        kwargs["request_id"] = job.request_id
    return kwargs
