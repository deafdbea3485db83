"""The processing job: its payload is the inbox row id only; the row is the source of truth.

A provider with a queue of its own has a job class of its own on it
(``ProcessStripeEventJob`` on ``webhook-stripe-queue``...), so one provider's
backlog never holds up another's events; any other provider's events share
``ProcessWebhookEventJob`` on ``webhook-queue``. Within a queue, an event takes
its tenant's turn (the row's ``tenant_key``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import ClassVar

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
    """Processes one inbox event: of any provider, or of ``provider`` in a subclass (:func:`processing_job`)."""

    provider: ClassVar[str | None] = None
    queue = QueueName.WEBHOOK
    retry_limit = FromSetting("webhook_retry_limit")
    backoff_base_seconds = FromSetting("webhook_retry_base_seconds")
    timeout_seconds = FromSetting("webhook_job_timeout_seconds")

    async def handle(self, data: ProcessWebhookEventData) -> None:
        await process_event(self.resources, data.event_row_id, self.provider)


_JOBS: dict[str, type[ProcessWebhookEventJob]] = {}


def processing_job(provider: str, queue: str | None = None) -> type[ProcessWebhookEventJob]:
    """The job class of ``provider``'s events: ``ProcessStripeEventJob``, made once per process, for a provider
    with a queue of its own (``WebhookProvider.queue``, given where it is set up); else the shared one."""
    known = _JOBS.get(provider)
    if known is not None:
        if queue is not None and known.queue != queue:
            raise ValueError(f"Provider {provider!r} has its job on {known.queue}, not {queue}.")
        return known
    if queue is None or queue == QueueName.WEBHOOK:
        return ProcessWebhookEventJob
    words = "".join(word.capitalize() for word in re.split(r"[^A-Za-z0-9]+", provider) if word)
    attributes = {"provider": provider, "queue": queue, "__module__": __name__}
    job_cls = type(f"Process{words}EventJob", (ProcessWebhookEventJob,), attributes)
    _JOBS[provider] = job_cls
    return job_cls


async def queue_processing(
    queue: MessageQueue,
    provider: str,
    row_id: int,
    *,
    tenant_key: str | None = None,
    request_id: JobRequestId = CURRENT_REQUEST,
) -> bool:
    """Queue the processing job of one inbox row; False when its job already waits, runs or retries.

    ``request_id``: the row's (its delivery's), so that every line of its processing carries it; whoever
    queues it again (an operator's retry, the recovery cron) passes the stored one. ``tenant_key``: the row's,
    so it takes its tenant's turn.
    """
    job_id = await queue.add(
        processing_job(provider),
        ProcessWebhookEventData(event_row_id=row_id),
        deduplication_id=deduplication_id(row_id),
        request_id=request_id,
        tenant_key=tenant_key,
    )
    return job_id is not None


async def queue_processing_many(
    queue: MessageQueue, rows: Iterable[tuple[str, int, str | None, str | None]]
) -> list[bool]:
    """``queue_processing`` for a page of rows, (provider, row id, tenant key, request id), one round trip each
    provider (the recovery cron)."""
    rows = list(rows)
    queued: dict[int, bool] = {}
    for provider in dict.fromkeys(provider for provider, *_ in rows):
        mine = [row for row in rows if row[0] == provider]
        items = [(ProcessWebhookEventData(event_row_id=row_id), deduplication_id(row_id)) for _, row_id, _, _ in mine]
        ids = await queue.add_many(
            processing_job(provider),
            items,
            request_ids=[request_id for *_, request_id in mine],
            tenant_keys=[tenant_key for _, _, tenant_key, _ in mine],
        )
        queued.update({row[1]: job_id is not None for row, job_id in zip(mine, ids, strict=True)})
    return [queued[row_id] for _, row_id, _, _ in rows]
