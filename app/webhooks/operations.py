"""What an operator does to the inbox, from the command line or the operations page: the same code for both."""

from __future__ import annotations

from dataclasses import dataclass

from app.core import tracing
from app.core.commands import plural
from app.core.module import loaded_modules
from app.core.resources import Resources
from app.webhooks.handlers import SyncedEvents, find_handler
from app.webhooks.inbox import EventRecord, Inbox, InboxUpkeep
from app.webhooks.jobs import ProcessWebhookEventData, deduplication_id, processing_job, queue_processing
from app.webhooks.maintenance import reopen_abandoned


class OperatorError(Exception):
    """The action cannot be done as asked; the message says why and what to do instead."""


def reopened_message(count: int) -> str:
    return f"Reopened {plural(count, 'webhook event')}."


@dataclass(frozen=True)
class Outcome:
    event: EventRecord
    message: str


async def find_one(resources: Resources, identifier: str, provider: str | None = None) -> EventRecord:
    matches = await Inbox(resources.db).find(identifier, provider)
    if not matches:
        raise OperatorError(f"No webhook event with row id or event id {identifier!r}.")
    if len(matches) > 1:
        raise OperatorError(f"{identifier!r} matches {len(matches)} events: name the provider too.")
    return matches[0]


async def retry(resources: Resources, identifier: str, provider: str | None = None) -> Outcome:
    """Queue one unprocessed event now; a set-aside one is reopened first. Its run continues the delivery's trace."""
    event = await find_one(resources, identifier, provider)
    with tracing.resumed(event.trace_context, "retry webhook event"):
        return await _retry(resources, event)


async def _retry(resources: Resources, event: EventRecord) -> Outcome:
    name = f"{event.provider} event {event.event_id} (row {event.id})"
    if event.processed_at is not None:
        raise OperatorError(f"Event {event.event_id} is already processed: replay it instead.")
    if event.abandoned_at is not None:
        await reopen_abandoned(resources, event.id)
        return Outcome(event, f"Reopened and queued {name}.")
    handling = find_handler(loaded_modules(resources), event.provider)
    if isinstance(handling, SyncedEvents) and event.sync_subject:  # its subject read now, not after a backoff
        await handling.sync(resources, event.sync_subject, event.received_at, event.request_id, now=True)
        return Outcome(event, f"Queued {name}: {event.sync_subject} is read again at the budget's next free slots.")
    if await _queue(resources, event):
        return Outcome(event, f"Queued {name}.")
    job_cls = processing_job(event.provider)
    state = await resources.queue.state(deduplication_id(event.id), job_cls.queue)
    if state == "deferred":  # a retry waiting out its backoff: one more run now (the later one finds it done)
        now = await resources.queue.add(
            job_cls,
            ProcessWebhookEventData(event_row_id=event.id),
            deduplication_id=f"{deduplication_id(event.id)}:operator",
            request_id=event.request_id,
            tenant_key=event.tenant_key,
        )
        if now is not None:
            return Outcome(event, f"Queued {name} to run now (its waiting retry then finds it done).")
    return Outcome(event, f"Already running: {name}." if state == "in_progress" else f"Already queued: {name}.")


async def _queue(resources: Resources, event: EventRecord) -> bool:
    return await queue_processing(
        resources.queue, event.provider, event.id, tenant_key=event.tenant_key, request_id=event.request_id
    )


async def replay(resources: Resources, identifier: str, provider: str | None = None) -> Outcome:
    """Process an event again (after a handler fix): unprocessed, attempts reset, queued."""
    event = await find_one(resources, identifier, provider)
    await InboxUpkeep(resources.db).reset_for_replay(event.id)
    await _queue(resources, event)
    return Outcome(event, f"Replaying {event.provider} event {event.event_id} (row {event.id}).")


async def reopen_all(resources: Resources) -> str:
    return reopened_message(len(await reopen_abandoned(resources)))
