"""The processing job: its payload is the inbox row id only; the row is the source of truth."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from app.core.request_context import CURRENT_REQUEST, JobRequestId
from app.core.resources import MessageQueue
from app.queue.job import FromSetting, Job
from app.queue.queues import QueueName
from app.webhooks.processing import process_event


class ProcessWebhookEventData(msgspec.Struct, frozen=True):
    event_row_id: int


def deduplication_id(row_id: int) -> str:
    """One waiting, running or retrying job per inbox row, whoever queues it."""
    return f"webhook-event:{row_id}"


class ProcessWebhookEventJob(Job[ProcessWebhookEventData]):
    queue = QueueName.WEBHOOK
    retry_limit = FromSetting("webhook_retry_limit")
    backoff_base_seconds = FromSetting("webhook_retry_base_seconds")
    timeout_seconds = FromSetting("webhook_job_timeout_seconds")

    async def handle(self, data: ProcessWebhookEventData) -> None:
        await process_event(self.resources, data.event_row_id)


async def queue_processing(queue: MessageQueue, row_id: int, *, request_id: JobRequestId = CURRENT_REQUEST) -> bool:
    """Queue the processing job of one inbox row; False when its job already waits, runs or retries.

    ``request_id``: the row's (its delivery's), so that every line of its processing carries it; whoever
    queues it again (an operator's retry, the recovery cron) passes the stored one.
    """
    job_id = await queue.add(
        ProcessWebhookEventJob,
        ProcessWebhookEventData(event_row_id=row_id),
        deduplication_id=deduplication_id(row_id),
        request_id=request_id,
    )
    return job_id is not None


async def queue_processing_many(queue: MessageQueue, rows: Iterable[tuple[int, str | None]]) -> list[bool]:
    """``queue_processing`` for a page of rows, (row id, its request id), in one round trip (the recovery cron)."""
    rows = list(rows)
    items = [(ProcessWebhookEventData(event_row_id=row_id), deduplication_id(row_id)) for row_id, _ in rows]
    queued = await queue.add_many(ProcessWebhookEventJob, items, request_ids=[request_id for _, request_id in rows])
    return [job_id is not None for job_id in queued]
