"""Stripe's objects as billing uses them: frozen dataclasses, parsed from the API's JSON (no SDK here).

The rest of billing sees these, never ``StripeObject``s (which are not dicts in stripe 16).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

MAX_ID_CHARS = 200
"""An id longer than this (or holding a NUL) names nothing Stripe has: an event naming it is set aside, not stored
under it."""
MirrorKind = Literal["dispute", "refund", "early_fraud_warning"]
CustomerOfKind = Literal["subscription", "invoice"]
"""What a thin event may name without billing knowing whose it is: read once for its customer."""


@dataclass(frozen=True)
class Subscription:
    id: str
    status: str
    price_id: str | None
    quantity: int | None
    current_period_end: datetime | None
    cancel_at_period_end: bool


@dataclass(frozen=True)
class CustomerBilling:
    """A customer's subscriptions as Stripe has them now, newest first (none once the customer is deleted)."""

    customer_id: str
    deleted: bool
    subscriptions: tuple[Subscription, ...]


@dataclass(frozen=True)
class CheckoutSession:
    id: str
    customer_id: str | None
    client_reference_id: str | None


@dataclass(frozen=True)
class Charge:
    """What billing takes from a charge: its customer, amount and currency, which Stripe does not change.

    A refund moves ``amount_refunded``, not ``amount``; a customer, once set,
    stays (Stripe only lets one be added to a charge that had none, which the
    next event about the charge's objects then sees). So they may be read
    before the locks that order syncs and used after them.
    """

    id: str
    customer_id: str | None
    amount: int | None
    currency: str | None


@dataclass(frozen=True)
class MirroredObject:
    """A dispute, refund or early fraud warning as read, with the customer its charge belongs to."""

    kind: MirrorKind
    stripe_id: str
    status: str | None
    amount: int | None
    currency: str | None
    reason: str | None
    created_at: datetime | None
    customer_id: str | None
    charge: Charge | None


@dataclass(frozen=True)
class RefundedCharge:
    """A charge and its refunds, as Stripe lists them now."""

    charge: Charge
    refunds: tuple[MirroredObject, ...]


def timestamp(value: Any) -> datetime | None:
    return datetime.fromtimestamp(int(value), UTC) if value is not None else None


def stripe_id(value: Any) -> str | None:
    """An id from an event body (not trusted), or None when it cannot name a Stripe object."""
    if not isinstance(value, str) or not value or len(value) > MAX_ID_CHARS or "\x00" in value:
        return None
    return value


def rfc3339(moment: datetime) -> str:
    """A time as the v2 API writes it (``2026-10-01T12:00:00.000Z``)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def link_id(value: Any) -> str | None:
    """A link is an id, or the object itself when expanded."""
    if isinstance(value, Mapping):
        return str(value["id"])
    return str(value) if value else None


def parse_charge(data: Mapping[str, Any]) -> Charge:
    return Charge(str(data["id"]), link_id(data.get("customer")), data.get("amount"), data.get("currency"))


def parse_subscription(data: Mapping[str, Any]) -> Subscription:
    """The seat item is the subscription's first item; ``current_period_end`` moved there in newer API versions."""
    items = data.get("items", {}).get("data") or [{}]
    item = items[0]
    period_end = item.get("current_period_end", data.get("current_period_end"))
    return Subscription(
        id=str(data["id"]),
        status=str(data["status"]),
        price_id=link_id(item.get("price")),
        quantity=item.get("quantity"),
        current_period_end=timestamp(period_end),
        cancel_at_period_end=bool(data.get("cancel_at_period_end")),
    )
