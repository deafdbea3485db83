"""The interface every queue driver offers (arq in production, sync in tests)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, Protocol

from app.queue.job import Job

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

JobState = Literal["queued", "deferred", "in_progress", "absent"]


class MessageQueue(Protocol):
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
        """Queue a job; ``None`` when a job with that deduplication id waits, runs or retries.

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
        ...

    async def add_many(self, job_cls: type[Job[Any]], items: Sequence[tuple[Any, str | None]]) -> list[str | None]:
        """``add`` for several jobs of one class, given as (data, deduplication id): per job, its id or ``None``.

        One round trip to Redis instead of one per job (the recovery cron queues pages of events).
        """
        ...

    async def relay_outbox(self, *, session: AsyncSession | None = None) -> int:
        """Queue committed staged jobs and delete their rows; returns how many rows were relayed.

        With ``session``, after its commit: the jobs that session staged (the
        webhook pipeline does this, so its follow-up jobs start at once).
        Without: the oldest staged jobs, a batch at a time (every worker's
        relay loop). Raises ``QueueUnavailableError`` when Redis does not take
        them; the rows stay for the next round.
        """
        ...

    async def state(self, deduplication_id: str) -> JobState: ...

    async def close(self) -> None: ...
