"""What an operator does to the inbox, from the command line or the operations page: the same code for both."""

from __future__ import annotations

from dataclasses import dataclass

from app.core.commands import plural
from app.core.resources import Resources
from app.webhooks.inbox import EventRecord, Inbox
from app.webhooks.jobs import deduplication_id, queue_processing
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
    """Queue one unprocessed event now; a set-aside one is reopened first."""
    event = await find_one(resources, identifier, provider)
    name = f"{event.provider} event {event.event_id} (row {event.id})"
    if event.processed_at is not None:
        raise OperatorError(f"Event {event.event_id} is already processed: replay it instead.")
    if event.abandoned_at is not None:
        await reopen_abandoned(resources, event.id)
        return Outcome(event, f"Reopened and queued {name}.")
    if await queue_processing(resources.queue, event.id, request_id=event.request_id):
        return Outcome(event, f"Queued {name}.")
    job = deduplication_id(event.id)
    state = await resources.queue.state(job)
    if state == "deferred" and await resources.queue.run_now(job):  # a retry waiting out its backoff
        return Outcome(event, f"Queued {name}: its waiting retry runs now.")
    return Outcome(event, f"Already running: {name}." if state == "in_progress" else f"Already queued: {name}.")


async def replay(resources: Resources, identifier: str, provider: str | None = None) -> Outcome:
    """Process an event again (after a handler fix): unprocessed, attempts reset, queued."""
    event = await find_one(resources, identifier, provider)
    await Inbox(resources.db).reset_for_replay(event.id)
    await queue_processing(resources.queue, event.id, request_id=event.request_id)
    return Outcome(event, f"Replaying {event.provider} event {event.event_id} (row {event.id}).")


async def reopen_all(resources: Resources) -> str:
    return reopened_message(len(await reopen_abandoned(resources)))
