"""Placeholder until the queue drivers land: the sync driver only."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from app.queue.job import Job, JobContext
from app.queue.protocol import JobState, MessageQueue

if TYPE_CHECKING:
    from app.core.resources import Resources


class SyncQueue:
    def __init__(self, resources: Resources) -> None:
        self.resources = resources

    async def add(
        self,
        job_cls: type[Job[Any]],
        data: Any,
        *,
        retry_limit: int | None = None,
        delay: timedelta | None = None,
        deduplication_id: str | None = None,
    ) -> str | None:
        raw = job_cls.encode_data(data)
        job_id = deduplication_id or "sync"
        policy = job_cls.retry_policy(self.resources.settings)
        context = JobContext(self.resources, job_id, 1, retry_limit or policy.retry_limit, job_cls.queue)
        await job_cls(context).handle(job_cls.decode_data(raw))
        return job_id

    async def state(self, deduplication_id: str) -> JobState:
        return "absent"

    async def close(self) -> None:
        return None


def create_message_queue(resources: Resources) -> MessageQueue:
    return SyncQueue(resources)
