"""Stripe events: each says only WHICH customer, checkout, dispute, refund, charge or fraud warning changed.

The state itself is read back from the Stripe API by a sync of that subject
(``app/billing/sync.py``): an event body may be old, repeated or out of order,
the API's answer is current. This module decides, from the verified body, each
event's subject (what to read) and tenant (the customer whose turn it takes
in the Stripe queue), and is the one list of the Stripe events billing
handles, so of those the intake stores.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from app.billing.events_api import StripeEventSource
from app.billing.sync import preview_sync, request_sync
from app.webhooks.handlers import SyncedEvents

MAX_ID_CHARS = 200
"""An id longer than this (or holding a NUL) names nothing Stripe has: the event is set aside, not stored under it."""


def _object(payload: Mapping[str, Any]) -> Mapping[str, Any]:
    data = payload.get("data")
    obj = data.get("object") if isinstance(data, Mapping) else None
    return obj if isinstance(obj, Mapping) else {}


def _link(obj: Mapping[str, Any], name: str) -> str | None:
    """An id the event's ``data.object`` carries (itself for ``id``); an expanded link gives its ``id``."""
    value = obj.get(name)
    if isinstance(value, Mapping):
        value = value.get("id")
    if not isinstance(value, str) or not value or len(value) > MAX_ID_CHARS or "\x00" in value:
        return None
    return value


def _subject(kind: str, field: str) -> Callable[[Mapping[str, Any]], str | None]:
    def subject(payload: Mapping[str, Any]) -> str | None:
        found = _link(_object(payload), field)
        return f"{kind}:{found}" if found else None

    return subject


def customer_tenant(customer_id: str) -> str:
    """The tenant key of a Stripe customer's events (and so of its workspace's, in the inbox): the id itself."""
    return customer_id


def stripe_tenant(event_type: str, payload: Mapping[str, Any]) -> str | None:
    """The customer the event's object belongs to; an object that names none (a dispute, a refund): its charge."""
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
}
_SYNCED = SyncedEvents(_SUBJECTS, sync=request_sync, tenant_key=stripe_tenant)
# With the Events API as its backfill source (only the types handled are asked for).
STRIPE_EVENTS = SyncedEvents(
    _SUBJECTS,
    sync=request_sync,
    tenant_key=stripe_tenant,
    backfill=StripeEventSource(_SYNCED.handles),
    preview=preview_sync,
)
