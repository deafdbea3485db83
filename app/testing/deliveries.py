"""Signed webhook deliveries and provider objects, built the way Stripe and Clerk send them.

Objects start from real-shaped fixtures (``app/testing/data``) so handlers are
tested against the fields the providers really send; callers override only the
ids, links and state a scenario is about. Signatures come from the providers'
own SDKs, so a delivery that verifies here verifies in production code too.

Stripe sends two payload styles, signed alike (``signed_stripe_delivery``
signs either): snapshot events (``stripe_event``: the object in ``data``) and
thin events (``thin_deliveries``).
"""

from __future__ import annotations

import base64
import copy
import json
import secrets
import string
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import stripe
from svix.webhooks import Webhook as SvixWebhook

_DATA_DIR = Path(__file__).parent / "data"
_ALPHANUMERIC = string.ascii_letters + string.digits
STRIPE_API_VERSION: str = stripe.api_version
"""The API version the installed SDK speaks; events claim the same one."""

__all__ = [
    "STRIPE_API_VERSION",
    "Delivery",
    "clerk_event",
    "generate_whsec",
    "random_id",
    "signed_clerk_delivery",
    "signed_stripe_delivery",
    "stripe_event",
    "stripe_object",
    "stripe_subscription",
]


@dataclass(frozen=True)
class Delivery:
    """One HTTP POST as the provider makes it: the exact bytes that were signed, and its headers."""

    body: bytes
    headers: dict[str, str]
    event_id: str
    event_type: str


def random_id(prefix: str, length: int = 24) -> str:
    """A fresh provider-style id (``cus_Ab3...``), so objects of one test never collide."""
    return f"{prefix}_" + "".join(secrets.choice(_ALPHANUMERIC) for _ in range(length))


def generate_whsec() -> str:
    """A random ``whsec_`` secret valid for both Stripe (HMAC key as-is) and svix (base64 key)."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode("ascii")


@cache
def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((_DATA_DIR / name).read_text(encoding="utf-8"))
    return data


def stripe_object(kind: str, **overrides: Any) -> dict[str, Any]:
    """A Stripe object of `kind` (a fixture key such as ``customer`` or ``checkout.session``).

    Top-level fields are replaced by `overrides`; the id is fresh unless given,
    with the fixture's prefix (``cus_``, ``cs_test_``, ``issfr_``...).
    """
    resources = _load("stripe_fixtures.json")["resources"]
    if kind not in resources:
        raise KeyError(f"No Stripe fixture {kind!r}; known kinds: {sorted(resources)}")
    obj: dict[str, Any] = copy.deepcopy(resources[kind])
    obj["id"] = random_id(str(obj["id"]).rsplit("_", 1)[0])
    obj.update(overrides)
    return obj


def stripe_subscription(
    customer: str,
    *,
    id: str | None = None,
    status: str = "active",
    quantity: int = 3,
    price_id: str = "price_seats",
    current_period_end: int | None = None,
    cancel_at_period_end: bool = False,
    **overrides: Any,
) -> dict[str, Any]:
    """A subscription with one seat-priced item.

    ``current_period_end`` is set both top-level (older API versions) and on
    the item (where Stripe moved it), so billing code works with either.
    """
    now = int(time.time())
    sub_id = id or random_id("sub")
    period_end = current_period_end if current_period_end is not None else now + 30 * 86400
    ended = now if status in {"canceled", "incomplete_expired"} else None
    item = stripe_object(
        "subscription_item",
        subscription=sub_id,
        quantity=quantity,
        current_period_start=now,
        current_period_end=period_end,
    )
    item["price"]["id"] = price_id
    item["plan"]["id"] = price_id
    sub = stripe_object(
        "subscription",
        id=sub_id,
        customer=customer,
        status=status,
        cancel_at_period_end=cancel_at_period_end,
        cancel_at=period_end if cancel_at_period_end else None,
        canceled_at=ended,
        ended_at=ended,
        created=now,
        start_date=now,
        current_period_start=now,
        current_period_end=period_end,
    )
    sub["items"] = {
        "object": "list",
        "data": [item],
        "has_more": False,
        "url": f"/v1/subscription_items?subscription={sub_id}",
    }
    sub.update(overrides)
    return sub


def stripe_event(
    event_type: str,
    obj: dict[str, Any],
    *,
    event_id: str | None = None,
    created: int | None = None,
    previous_attributes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Stripe event envelope carrying `obj` as ``data.object``."""
    event = stripe_object(
        "event",
        id=event_id or random_id("evt"),
        type=event_type,
        created=created if created is not None else int(time.time()),
        api_version=STRIPE_API_VERSION,
        pending_webhooks=1,
    )
    event["data"] = {"object": obj}
    if previous_attributes is not None:
        event["data"]["previous_attributes"] = previous_attributes
    return event


def _secrets(secret: str | Sequence[str]) -> list[str]:
    """One secret, or several to mimic a rotation window where the provider signs with each."""
    return [secret] if isinstance(secret, str) else list(secret)


def _encode(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode("utf-8")


def signed_stripe_delivery(
    event: dict[str, Any], secret: str | Sequence[str], *, timestamp: int | None = None
) -> Delivery:
    """The event as Stripe POSTs it, signed with each secret (one ``v1=`` per secret)."""
    body = _encode(event)
    ts = timestamp if timestamp is not None else int(time.time())
    headers = [
        stripe.WebhookSignature.generate_signature_header(body.decode("utf-8"), key, timestamp=ts)
        for key in _secrets(secret)
    ]
    signature = ",".join([headers[0]] + [h.split(",", 1)[1] for h in headers[1:]])
    return Delivery(
        body=body,
        headers={
            "Content-Type": "application/json",
            "Stripe-Signature": signature,
            "User-Agent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
        },
        event_id=str(event["id"]),
        event_type=str(event["type"]),
    )


def clerk_event(
    event_type: str,
    *,
    timestamp: int | None = None,
    instance_id: str = "ins_test",
    **data_overrides: Any,
) -> dict[str, Any]:
    """A Clerk envelope of `event_type` with ``data`` fields replaced by `data_overrides`.

    ``timestamp`` (ms) defaults to now; a ``data.updated_at`` not overridden
    follows it, so a fresh event is also the newest change of its object.
    """
    events = _load("clerk_events.json")["events"]
    if event_type not in events:
        raise KeyError(f"No Clerk fixture {event_type!r}; known types: {sorted(events)}")
    event: dict[str, Any] = copy.deepcopy(events[event_type])
    event["timestamp"] = timestamp if timestamp is not None else int(time.time() * 1000)
    event.setdefault("instance_id", instance_id)
    if "updated_at" in event["data"]:
        event["data"]["updated_at"] = event["timestamp"]
    event["data"].update(data_overrides)
    return event


def _utc(timestamp: datetime | int | None) -> datetime:
    """svix signs the wall-clock fields as if UTC, so any other zone would sign a wrong time."""
    if timestamp is None:
        return datetime.now(UTC)
    if isinstance(timestamp, int):
        return datetime.fromtimestamp(timestamp, UTC)
    if timestamp.tzinfo is None:
        raise ValueError("Pass a timezone-aware datetime (or unix seconds) to sign a Clerk delivery")
    return timestamp.astimezone(UTC)


def signed_clerk_delivery(
    event: dict[str, Any],
    secret: str | Sequence[str],
    *,
    msg_id: str | None = None,
    timestamp: datetime | int | None = None,
) -> Delivery:
    """The event as Clerk (svix) POSTs it; the ``svix-id`` is the event id the inbox keys on."""
    body = _encode(event)
    message_id = msg_id or random_id("msg", 27)
    when = _utc(timestamp)
    signature = " ".join(SvixWebhook(key).sign(message_id, when, body.decode("utf-8")) for key in _secrets(secret))
    return Delivery(
        body=body,
        headers={
            "Content-Type": "application/json",
            "svix-id": message_id,
            "svix-timestamp": str(int(when.timestamp())),
            "svix-signature": signature,
            "User-Agent": "Svix-Webhooks/1.0",
        },
        event_id=message_id,
        event_type=str(event["type"]),
    )
