"""Run events through the real webhook pipeline in tests: over HTTP, or straight into the inbox.

``deliver_and_wait`` is the end-to-end path: the signed delivery is POSTed to
the API (in process, or a server's base URL), then the inbox row is polled
until it is processed, whoever processes it (the sync driver inside the
request, or a worker process). ``process_delivery`` is the short path for
handler tests: it stores the event as the intake would and runs one processing
attempt as the worker would, raising what the handler raised.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import datetime

import httpx

from app.core.commands import plural
from app.core.db import Database
from app.core.module import loaded_modules
from app.core.resources import Resources
from app.testing.deliveries import Delivery
from app.webhooks.handlers import stored_keys
from app.webhooks.inbox import Inbox
from app.webhooks.payload import decode_payload, encode_for_inbox
from app.webhooks.processing import process_event
from app.webhooks.verification import VerifiedEvent

__all__ = ["DeliveryTimeoutError", "InboxRow", "deliver_and_wait", "process_delivery", "provider_of", "read_inbox_row"]


@dataclass(frozen=True)
class InboxRow:
    """The inbox row of one event, as read."""

    row_id: int
    provider: str
    event_id: str
    type: str
    attempts: int
    processed_at: datetime | None
    last_error: str | None
    abandoned_at: datetime | None

    @property
    def processed(self) -> bool:
        return self.processed_at is not None


class DeliveryTimeoutError(AssertionError):
    """The event was not processed in time; the message says what the inbox row shows."""


def provider_of(delivery: Delivery) -> str:
    """``stripe`` or ``clerk``, from the headers the delivery is signed with."""
    headers = {name.lower() for name in delivery.headers}
    if "stripe-signature" in headers:
        return "stripe"
    if "svix-id" in headers:
        return "clerk"
    raise ValueError("Cannot tell the provider of this delivery: pass provider='...'.")


async def read_inbox_row(db: Database, provider: str, event_id: str) -> InboxRow | None:
    found = await Inbox(db).find(event_id, provider)
    row = next((record for record in found if record.event_id == event_id), None)
    if row is None:
        return None
    return InboxRow(
        row.id, row.provider, row.event_id, row.type, row.attempts, row.processed_at, row.last_error, row.abandoned_at
    )


async def _post(api: httpx.AsyncClient | str, path: str, delivery: Delivery) -> httpx.Response:
    if isinstance(api, str):
        async with httpx.AsyncClient(base_url=api, timeout=10) as client:
            return await client.post(path, content=delivery.body, headers=delivery.headers)
    return await api.post(path, content=delivery.body, headers=delivery.headers)


def _describe(row: InboxRow | None) -> str:
    if row is None:
        return "it is not in the inbox (an event type no module handles is acknowledged and dropped)"
    if row.abandoned_at is not None:
        return f"it was set aside after {plural(row.attempts, 'attempt')}; last error: {row.last_error}"
    if row.attempts == 0:
        return "no attempt ran yet: is a worker running with the module that handles it (app/runtime.py)?"
    return f"{plural(row.attempts, 'attempt')} failed so far; last error: {row.last_error}"


async def deliver_and_wait(
    api: httpx.AsyncClient | str,
    delivery: Delivery,
    *,
    db: Database,
    provider: str | None = None,
    timeout_seconds: float = 10.0,
    poll_interval: float = 0.05,
) -> InboxRow:
    """POST the delivery to ``/webhooks/<provider>`` and wait until its inbox row is processed.

    ``api`` is an ``AsyncTestClient`` (or any ``httpx.AsyncClient``) or a base
    URL. ``db`` must belong to the caller's event loop (e.g. the test's
    ``resources.db``), not to the app's. Raises :class:`DeliveryTimeoutError`
    after ``timeout_seconds``, or at once if the API refuses the delivery or
    the event is set aside.
    """
    provider = provider or provider_of(delivery)
    response = await _post(api, f"/webhooks/{provider}", delivery)
    if response.status_code != 200:
        raise DeliveryTimeoutError(
            f"The API answered {response.status_code} to {provider} event {delivery.event_id}: {response.text}"
        )
    deadline = time.monotonic() + timeout_seconds
    while True:
        row = await read_inbox_row(db, provider, delivery.event_id)
        if row is not None and row.processed:
            return row
        if (row is not None and row.abandoned_at is not None) or time.monotonic() >= deadline:
            raise DeliveryTimeoutError(
                f"{provider} event {delivery.event_id} ({delivery.event_type}) was not processed within "
                f"{timeout_seconds:g}s: {_describe(row)}."
            )
        await asyncio.sleep(poll_interval)


async def process_delivery(resources: Resources, delivery: Delivery, *, provider: str | None = None) -> InboxRow:
    """Store the event as the intake does after verifying it, then run one processing attempt as a worker does.

    ``resources`` must be opened with the modules whose handlers should run
    (``open_resources(settings, [...])``). The handler's exception is
    raised, after the pipeline recorded it on the row; call again to retry.
    """
    provider = provider or provider_of(delivery)
    event = VerifiedEvent.of(delivery.event_id, delivery.event_type, decode_payload(delivery.body), delivery.body)
    text = encode_for_inbox(event.payload, delivery.body, nul_replaced=event.nul_replaced)
    keys = await stored_keys(loaded_modules(resources), provider)(resources, event.event_type, event.payload)
    stored = await Inbox(resources.db).store(
        provider, event.event_id, event.event_type, text, tenant_key=keys.tenant, sync_subject=keys.subject
    )
    await process_event(resources, stored.row_id, provider)
    row = await read_inbox_row(resources.db, provider, delivery.event_id)
    assert row is not None
    return row
