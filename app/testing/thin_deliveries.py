"""Stripe's thin events, as an event destination with thin payloads sends them (sign with ``signed_stripe_delivery``).

A thin event (``"object": "v2.core.event"``) carries a ``v1.`` type and only
the object that changed (``related_object``: id, type, url); the stripe SDK's
own parser (``StripeClient.parse_event_notification``) reads these as
Stripe's. ``stripe_thin_twin`` gives the thin event of the change a snapshot
event (``stripe_event``) reports, naming it in ``snapshot_event``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from app.billing.stripe_objects import rfc3339
from app.testing.deliveries import random_id

__all__ = ["RELATED_PATHS", "THIN_EVENT_OBJECT", "stripe_ping_event", "stripe_thin_event", "stripe_thin_twin"]

THIN_EVENT_OBJECT = "v2.core.event"
# What a thin type's related object is (the SDK's notification classes say so, fetch_related_object()): by prefix,
# the longest that matches first.
_RELATED_TYPES = (
    ("v1.customer.subscription.", "subscription"),
    ("v1.invoice.", "invoice"),
    ("v1.checkout.session.", "checkout.session"),
    ("v1.charge.dispute.", "dispute"),
    ("v1.charge.", "charge"),
    ("v1.refund.", "refund"),
    ("v1.radar.early_fraud_warning.", "radar.early_fraud_warning"),
)
# The API path of each related object type, as Stripe writes it in related_object.url.
RELATED_PATHS = {
    "customer": "customers",
    "subscription": "subscriptions",
    "invoice": "invoices",
    "checkout.session": "checkout/sessions",
    "dispute": "disputes",
    "charge": "charges",
    "refund": "refunds",
    "radar.early_fraud_warning": "radar/early_fraud_warnings",
}


def stripe_thin_event(
    event_type: str,
    related_id: str,
    related_type: str | None = None,
    *,
    event_id: str | None = None,
    created: datetime | None = None,
    snapshot_event: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A thin event as an event destination with thin payloads sends it: ``event_type`` (``v1.invoice.paid``)
    naming ``related_id``, an object of ``related_type`` (by default the one Stripe names for the type).

    ``snapshot_event``: the id of the snapshot event of the same change (a destination of each style sends both);
    ``fields`` adds or replaces top-level fields (``related_object=None`` leaves it out, as no handled type may).
    """
    kind = related_type or next((kind for prefix, kind in _RELATED_TYPES if event_type.startswith(prefix)), None)
    if kind is None:
        raise KeyError(f"No related object type known for {event_type!r}: pass related_type=...")
    path = RELATED_PATHS.get(kind, kind.replace(".", "/") + "s")
    event: dict[str, Any] = {
        "id": event_id or random_id("evt_test", 40),
        "object": THIN_EVENT_OBJECT,
        "type": event_type,
        "livemode": False,
        "created": rfc3339(created or datetime.now(UTC)),
        "related_object": {"id": related_id, "type": kind, "url": f"/v1/{path}/{related_id}"},
    }
    if snapshot_event is not None:
        event["snapshot_event"] = snapshot_event
    event.update(fields)
    return {key: value for key, value in event.items() if value is not None}


def stripe_thin_twin(snapshot: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """The thin event of the change a snapshot event (``stripe_event``) reports, as a thin destination sends it."""
    obj = snapshot["data"]["object"]
    return stripe_thin_event(
        f"v1.{snapshot['type']}",
        str(obj["id"]),
        str(obj["object"]),
        created=datetime.fromtimestamp(int(snapshot["created"]), UTC),
        snapshot_event=str(snapshot["id"]),
        **fields,
    )


def stripe_ping_event(**fields: Any) -> dict[str, Any]:
    """``v2.core.event_destination.ping``: what Stripe sends when a destination is tested (answered 200, not stored)."""
    destination = random_id("ed_test", 40)
    return stripe_thin_event(
        "v2.core.event_destination.ping",
        destination,
        "v2.core.event_destination",
        related_object={
            "id": destination,
            "type": "v2.core.event_destination",
            "url": f"/v2/core/event_destinations/{destination}",
        },
        **fields,
    )
