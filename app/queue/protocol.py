"""The interface every queue driver offers (arq in production, sync in tests)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Literal, Protocol

from app.queue.job import Job

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
    ) -> str | None:
        """Queue a job; ``None`` when a job with that deduplication id waits, runs or retries.

        Never waits more than about a second on an unreachable Redis: raises
        ``QueueUnavailableError`` instead.
        """
        ...

    async def add_many(self, job_cls: type[Job[Any]], items: Sequence[tuple[Any, str | None]]) -> list[str | None]:
        """``add`` for several jobs of one class, given as (data, deduplication id): per job, its id or ``None``.

        One round trip to Redis instead of one per job (the recovery cron queues pages of events).
        """
        ...

    async def state(self, deduplication_id: str) -> JobState: ...

    async def close(self) -> None: ...
