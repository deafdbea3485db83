"""Stripe events: each says only WHICH customer, checkout, dispute, refund, charge or fraud warning changed.

The state itself is read back from the Stripe API by a sync of that subject
(``app/billing/sync.py``): an event body may be old, repeated or out of order,
the API's answer is current. This module decides, from the verified body, each
event's subject (what to read) and tenant (the customer whose turn it takes
in the Stripe queue), and is the one list of the Stripe events billing
handles, so of those the intake stores: snapshot events and their thin
twins (``v1.``-prefixed, ``thin_events.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from app.billing.events_api import StripeEventSource
from app.billing.stripe_objects import stripe_id
from app.billing.sync import preview_sync, request_sync
from app.billing.thin_events import THIN_SUBJECTS, known_keys, related_id
from app.webhooks.handlers import SyncedEvents
from app.webhooks.providers.stripe import is_thin_event


def _object(payload: Mapping[str, Any]) -> Mapping[str, Any]:
    data = payload.get("data")
    obj = data.get("object") if isinstance(data, Mapping) else None
    return obj if isinstance(obj, Mapping) else {}


def _link(obj: Mapping[str, Any], name: str) -> str | None:
    """An id the event's ``data.object`` carries (itself for ``id``); an expanded link gives its ``id``."""
    value = obj.get(name)
    if isinstance(value, Mapping):
        value = value.get("id")
    return stripe_id(value)


def _subject(kind: str, field: str) -> Callable[[Mapping[str, Any]], str | None]:
    def subject(payload: Mapping[str, Any]) -> str | None:
        found = _link(_object(payload), field)
        return f"{kind}:{found}" if found else None

    return subject


def customer_tenant(customer_id: str) -> str:
    """The tenant key of a Stripe customer's events (and so of its workspace's, in the inbox): the id itself."""
    return customer_id


def stripe_tenant(event_type: str, payload: Mapping[str, Any]) -> str | None:
    """The customer the event's object belongs to; an object that names none (a dispute, a refund): its charge.

    A thin event names only its related object: its id (``known_keys`` puts the customer instead when billing
    knows it).
    """
    if is_thin_event(event_type, payload):
        return related_id(payload)
    obj = _object(payload)
    customer = _link(obj, "customer")
    return customer_tenant(customer) if customer is not None else _link(obj, "charge")


# The Stripe events billing handles (docs/deploy.md lists them to subscribe to), and so the ones the intake stores,
# each with the subject whose sync covers it.
_SUBJECTS = {
    "checkout.session.completed": _subject("checkout", "id"),
    "customer.subscription.*": _subject("customer", "customer"),
    "invoice.paid": _subject("customer", "customer"),
    "invoice.payment_failed": _subject("customer", "customer"),
    "charge.dispute.*": _subject("dispute", "id"),
    "charge.refunded": _subject("charge", "id"),
    "refund.*": _subject("refund", "id"),
    "radar.early_fraud_warning.*": _subject("early_fraud_warning", "id"),
    # The same changes sent by a destination with thin payloads: the object they name (app/billing/thin_events.py).
    **THIN_SUBJECTS,
}
_SYNCED = SyncedEvents(_SUBJECTS, sync=request_sync, tenant_key=stripe_tenant)
# With the Events APIs as its backfill source (only the types handled are asked for), and what billing's tables
# know of a thin event's related object.
STRIPE_EVENTS = SyncedEvents(
    _SUBJECTS,
    sync=request_sync,
    tenant_key=stripe_tenant,
    backfill=StripeEventSource(_SYNCED.handles),
    preview=preview_sync,
    known=known_keys,
)
