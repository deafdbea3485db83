"""Shared connections of one process, and the queue interface they carry.

The composition root (``app/runtime.py``) builds them, the same set for the
API, the worker and the commands; nothing here knows the queue's drivers or
the feature modules. :class:`MessageQueue` is the interface jobs are queued
through (arq in production, sync in tests), declared here so that every
layer above can use it without knowing who implements it; it owns ``add``, and
a driver implements the one step that differs (``_add``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, TypeVar, cast

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.db import Database
from app.core.request_context import CURRENT_REQUEST, JobRequestId
from app.core.settings import Settings
from app.core.tracing import CURRENT_TRACE, JobTraceContext

JobState = Literal["queued", "deferred", "in_progress", "absent"]
T = TypeVar("T")


@dataclass(frozen=True)
class JobOptions:
    """How one job is queued: ``MessageQueue.add``'s keywords (described there), as a driver receives them."""

    retry_limit: int | None = None
    delay: timedelta | None = None
    deduplication_id: str | None = None
    request_id: JobRequestId = CURRENT_REQUEST
    tenant_key: str | None = None
    trace_context: JobTraceContext = CURRENT_TRACE


class MessageQueue(ABC):
    """Jobs are queued by class (``app.queue.job.Job``), never by name."""

    async def add(
        self,
        job_cls: type[Any],
        data: Any,
        *,
        retry_limit: int | None = None,
        delay: timedelta | None = None,
        deduplication_id: str | None = None,
        session: AsyncSession | None = None,
        request_id: JobRequestId = CURRENT_REQUEST,
        tenant_key: str | None = None,
        trace_context: JobTraceContext = CURRENT_TRACE,
    ) -> str | None:
        """Queue a job; ``None`` when a job with that deduplication id waits, runs or retries.

        ``tenant_key``: whose work it is (a workspace, a customer): a queue serves its tenants in turn, so one
        tenant's backlog does not hold up another's job. By default the job class's ``tenant_field`` of the data.

        ``request_id``: the request the job is for, on every line it writes and on its Sentry events; by
        default the request (or job) that queues it. A job that works for an inbox event queued earlier
        names the event's own (the delivery's), whoever queues it again.

        ``trace_context``: the trace its attempts are spans of (tracing on), the same way: by default the
        running span's (a job queued from a request continues the request's trace), or an event's stored one.

        Never waits more than about a second on an unreachable Redis: raises
        ``QueueUnavailableError`` instead.

        With ``session``: stage the job in that session's transaction instead
        (``app.queue.outbox``; no Redis call). It is queued only if the
        transaction commits, and even if this process dies right after the
        commit: a worker relays it within about a second, or the committing
        code at once with :meth:`relay_outbox`. Returns the job's id; whether
        a job with that deduplication id already waits is decided when it is
        relayed.
        """
        options = JobOptions(
            retry_limit=retry_limit,
            delay=delay,
            deduplication_id=deduplication_id,
            request_id=request_id,
            tenant_key=tenant_key,
            trace_context=trace_context,
        )
        return await self._add(job_cls, data, options, session=session)

    @abstractmethod
    async def _add(
        self, job_cls: type[Any], data: Any, options: JobOptions, *, session: AsyncSession | None
    ) -> str | None:
        """``add`` with its keywords gathered in ``options``: stage the job in ``session``, or queue it now."""

    async def add_many(
        self,
        job_cls: type[Any],
        items: Sequence[tuple[Any, str | None]],
        *,
        request_ids: Sequence[str | None] | None = None,
        tenant_keys: Sequence[str | None] | None = None,
        trace_contexts: Sequence[str | None] | None = None,
    ) -> list[str | None]:
        """``add`` for several jobs of one class, given as (data, deduplication id): per job, its id or ``None``.

        ``request_ids``: each job's (as ``add``'s ``request_id``), in the order of ``items``; by default the
        request (or job) that queues them. ``trace_contexts``: each job's (as ``add``'s ``trace_context``), by
        default the running span's.

        One round trip to Redis instead of one per job (the recovery cron queues pages of events).
        """
        count = len(items)
        requests: Sequence[JobRequestId] = [CURRENT_REQUEST] * count if request_ids is None else request_ids
        tenants: Sequence[str | None] = [None] * count if tenant_keys is None else tenant_keys
        traces: Sequence[JobTraceContext] = [CURRENT_TRACE] * count if trace_contexts is None else trace_contexts
        jobs = [
            (data, JobOptions(deduplication_id=dedup, request_id=request, tenant_key=tenant, trace_context=trace))
            for (data, dedup), request, tenant, trace in zip(items, requests, tenants, traces, strict=True)
        ]
        return await self._add_many(job_cls, jobs)

    @abstractmethod
    async def _add_many(self, job_cls: type[Any], jobs: Sequence[tuple[Any, JobOptions]]) -> list[str | None]:
        """``add_many`` with each job's keywords gathered in its ``JobOptions``: queue them now."""

    @abstractmethod
    async def relay_outbox(self, *, session: AsyncSession | None = None) -> int:
        """Queue committed staged jobs and delete their rows; returns how many rows were relayed.

        With ``session``, after its commit: the jobs that session staged (the
        webhook pipeline does this, so its follow-up jobs start at once). When
        Redis does not take them it does not raise: they are safe in
        ``job_outbox``, one warning says so, and a worker queues them once
        Redis answers (0 relayed). Without: the oldest staged jobs, a batch at
        a time (every worker's relay loop); raises ``QueueUnavailableError``
        when Redis does not take them, and the rows stay for the next round.
        """

    @abstractmethod
    async def state(self, deduplication_id: str, queue: str) -> JobState:
        """Whether the job with that deduplication id waits on ``queue`` (due or deferred), runs, or is absent."""

    @abstractmethod
    async def close(self) -> None:
        """Close the driver's own connections."""


class Resources:
    """A process's connections, and the per-process clients its modules build.

    The feature modules loaded in this process are one of those, kept by the
    composition root (``app.core.module.loaded_modules``). A plain class, not a
    dataclass: Litestar injects it into routes and providers as it is (a
    dataclass would be validated field by field, the settings included, on
    every request).
    """

    queue: MessageQueue

    def __init__(self, settings: Settings, db: Database, redis: Redis) -> None:
        self.settings = settings
        self.db = db
        self.redis = redis
        self._shared: dict[type[Any], Any] = {}
        self._closers: list[Callable[[], Awaitable[None]]] = []

    def shared(self, kind: type[T], build: Callable[[], T]) -> T:
        """The process's one ``kind`` (a client a feature module keeps per process), built by ``build`` on first use.

        Keyed by the class, so the caller gets that type back: the core names no
        feature module's class, and no string key is looked up. ``build`` runs
        once per process (no await between the look-up and the store); what it
        opens, it closes through :meth:`add_closer`.
        """
        if kind not in self._shared:
            self._shared[kind] = build()
        return cast(T, self._shared[kind])

    def add_closer(self, close: Callable[[], Awaitable[None]]) -> None:
        self._closers.append(close)

    async def close(self) -> None:
        for close in reversed(self._closers):
            await close()
        self._closers.clear()
        await self.queue.close()
        await self.redis.aclose()
        await self.db.dispose()
