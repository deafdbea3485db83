"""Stripe's thin events: which subject's sync covers each, whose tenant it is, and what billing's tables know.

A thin event (``v1.customer.subscription.updated``, sent by an event
destination with thin payloads) carries no object, only the one that changed
(``related_object``: its id and type). Billing syncs it exactly as it syncs
the snapshot event of the same change (``handlers.py``); the question is only
which subject covers it:

- a checkout session, dispute, refund, fraud warning or refunded charge is a
  subject itself (``checkout:cs_...``, ``dispute:dp_...``): the thin event
  takes the snapshot event's subject from its related object's id;
- a subscription or an invoice is not: its customer is. When billing already
  holds the subscription (its workspace was synced with it), or the inbox
  holds the snapshot twin the event names (``snapshot_event``), the event is
  stored under the customer's subject at once (:func:`known_keys`, asked by
  the intake and the backfill): it coalesces with the customer's other events,
  so a burst about one subscription costs one read, and a thin event and its
  snapshot twin one between them. Otherwise it is stored under
  ``subscription:sub_...`` (or ``invoice:in_...``): the sync of that subject
  (``sync.py``) reads the object once, through the budget, for its customer,
  then does what a sync of that customer does and covers the customer's
  waiting events too; unless the customer's workspace was written from a read
  that began after each of its events arrived, which then costs no read.

The tenant (whose turn the event takes in the Stripe queue) is the customer
when billing knows it, else the related object's id: a burst about one object
still takes one tenant's turns. The lookups only refine what the body says: a
failed one leaves the body's keys, and the sync learns what it could not.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from app.billing.repository import BillingRepository
from app.billing.stripe_objects import stripe_id
from app.core.resources import Resources
from app.webhooks.handlers import EventKeys
from app.webhooks.inbox import Inbox
from app.webhooks.providers.stripe import is_thin_event

logger = logging.getLogger(__name__)

RESOLVED_KINDS = frozenset({"subscription", "invoice"})
"""Subject kinds that are not billing's subjects themselves: their sync reads the object for its customer."""
_HELD_KINDS = frozenset({"subscription", "dispute", "refund", "early_fraud_warning"})
"""What billing's tables hold by id (the workspace's subscription, the mirrors): their customer is known."""


def related_id(payload: Mapping[str, Any]) -> str | None:
    """The id of a thin event's ``related_object`` (checked by the intake: a string; here: a usable id)."""
    related = payload.get("related_object")
    return stripe_id(related.get("id")) if isinstance(related, Mapping) else None


def _related(kind: str) -> Callable[[Mapping[str, Any]], str | None]:
    def subject(payload: Mapping[str, Any]) -> str | None:
        found = related_id(payload)
        return f"{kind}:{found}" if found else None

    return subject


# The thin events billing handles (docs/deploy.md lists them for a thin destination), each with the kind of subject
# its related object names.
THIN_SUBJECTS = {
    "v1.checkout.session.completed": _related("checkout"),
    "v1.customer.subscription.*": _related("subscription"),
    "v1.invoice.paid": _related("invoice"),
    "v1.invoice.payment_failed": _related("invoice"),
    "v1.charge.dispute.*": _related("dispute"),
    "v1.charge.refunded": _related("charge"),
    "v1.refund.*": _related("refund"),
    "v1.radar.early_fraud_warning.*": _related("early_fraud_warning"),
}


async def known_keys(resources: Resources, event_type: str, payload: Mapping[str, Any], keys: EventKeys) -> EventKeys:
    """A thin event's keys as billing's tables or its snapshot twin know them (``SyncedEvents.known``)."""
    if keys.subject is None or not is_thin_event(event_type, payload):
        return keys
    kind, _, object_id = keys.subject.partition(":")
    try:
        customer = None
        if kind in _HELD_KINDS:
            customer = await BillingRepository(resources.db).customer_holding(kind, object_id)
        if customer is not None:
            return EventKeys(customer, f"customer:{customer}" if kind in RESOLVED_KINDS else keys.subject)
        return await _twin_keys(resources, kind, payload.get("snapshot_event"), keys)
    except Exception as exc:  # the body's keys are right too: its sync reads what this could not look up
        logger.warning("Could not look up what billing knows of %s (%s); its sync reads it.", keys.subject, exc)
        return keys


async def _twin_keys(resources: Resources, kind: str, twin: Any, keys: EventKeys) -> EventKeys:
    """The keys of the snapshot event of the same change, when the inbox holds it: its customer's."""
    if not isinstance(twin, str) or not twin:
        return keys
    stored = await Inbox(resources.db).keys_of("stripe", twin)
    if stored is None:
        return keys
    tenant, subject = stored
    moved = kind in RESOLVED_KINDS and subject is not None and subject.startswith("customer:")
    return EventKeys(tenant or keys.tenant, subject if moved else keys.subject)
