"""The processing job: its payload is the inbox row id only; the row is the source of truth.

A provider with a queue of its own declares a job class of its own beside it,
in one line (``class ProcessStripeEventJob(ProcessWebhookEventJob,
provider=STRIPE)``, on ``webhook-stripe-queue``), so one provider's backlog
never holds up another's events; any other provider's events share
``ProcessWebhookEventJob`` on ``webhook-queue``. Within a queue, an event takes
its tenant's turn (the row's ``tenant_key``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec

from app.core.request_context import CURRENT_REQUEST, JobRequestId
from app.core.resources import MessageQueue
from app.queue.job import FromSetting, Job
from app.queue.queues import QueueName
from app.webhooks.processing import process_event

if TYPE_CHECKING:  # a provider's file declares its job from this module: the type alone, no import back
    from app.webhooks.providers.base import WebhookProvider


class ProcessWebhookEventData(msgspec.Struct, frozen=True):
    event_row_id: int


def deduplication_id(row_id: int) -> str:
    """One waiting, running or retrying job per inbox row, whoever queues it."""
    return f"webhook-event:{row_id}"


class ProcessWebhookEventJob(Job[ProcessWebhookEventData]):
    """Processes one inbox event: of any provider, or, in a subclass declared with ``provider=``, of that one's.

    ``class ProcessStripeEventJob(ProcessWebhookEventJob, provider=STRIPE)`` gives Stripe's events their job:
    named by the class (arq, the metrics, the logs, ``/ops``), on the queue the provider names.
    """

    provider: ClassVar[str | None] = None
    queue: ClassVar[str] = QueueName.WEBHOOK
    retry_limit = FromSetting("webhook_retry_limit")
    backoff_base_seconds = FromSetting("webhook_retry_base_seconds")
    timeout_seconds = FromSetting("webhook_job_timeout_seconds")

    def __init_subclass__(cls, *, provider: WebhookProvider | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if provider is None:
            return
        known = _JOBS.get(provider.name)
        if known is not None:
            raise TypeError(f"Provider {provider.name!r} has a job already ({known.name()}): declare one, not two.")
        cls.provider, cls.queue = provider.name, provider.queue
        _JOBS[provider.name] = cls

    async def handle(self, data: ProcessWebhookEventData) -> None:
        await process_event(self.resources, data.event_row_id, self.provider)


_JOBS: dict[str, type[ProcessWebhookEventJob]] = {}
"""Provider name -> the job class declared for it (as its file is imported)."""


def processing_job(provider: str) -> type[ProcessWebhookEventJob]:
    """The job class of ``provider``'s events: the one declared for it, else the shared one."""
    return _JOBS.get(provider, ProcessWebhookEventJob)


def provider_job(provider: WebhookProvider) -> type[ProcessWebhookEventJob]:
    """:func:`processing_job`, checked against the queue ``provider`` names, for the module that runs the jobs."""
    job_cls = processing_job(provider.name)
    if job_cls.queue != provider.queue:
        raise TypeError(
            f"Provider {provider.name!r} names {provider.queue} for its events, but its job {job_cls.name()} runs on "
            f"{job_cls.queue}: declare its own beside it, "
            "`class Process<Name>EventJob(ProcessWebhookEventJob, provider=<the provider>)`."
        )
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
    queue: MessageQueue,
    rows: Iterable[tuple[str, int, str | None, str | None]],
    *,
    trace_contexts: Mapping[int, str | None] | None = None,
) -> list[bool]:
    """``queue_processing`` for a page of rows, (provider, row id, tenant key, request id), one round trip each
    provider (the recovery cron). ``trace_contexts``: row id -> the row's, which its job continues (tracing on)."""
    rows = list(rows)
    traces = trace_contexts or {}
    queued: dict[int, bool] = {}
    for provider in dict.fromkeys(provider for provider, *_ in rows):
        mine = [row for row in rows if row[0] == provider]
        items = [(ProcessWebhookEventData(event_row_id=row_id), deduplication_id(row_id)) for _, row_id, _, _ in mine]
        ids = await queue.add_many(
            processing_job(provider),
            items,
            request_ids=[request_id for *_, request_id in mine],
            tenant_keys=[tenant_key for _, _, tenant_key, _ in mine],
            trace_contexts=[traces.get(row_id) for _, row_id, _, _ in mine] if trace_contexts is not None else None,
        )
        queued.update({row[1]: job_id is not None for row, job_id in zip(mine, ids, strict=True)})
    return [queued[row_id] for _, row_id, _, _ in rows]
