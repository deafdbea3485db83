"""Stripe's Events APIs as the backfill's source: the handled events Stripe still lists, newest first.

Stripe keeps events 30 days, in two lists: snapshot events (``/v1/events``)
and thin events (``/v2/core/events``, what an event destination with thin
payloads sends). ``STRIPE_EVENT_PAYLOADS`` says which styles this endpoint's
destinations send, so which lists the backfill asks (both while moving from
one to the other). Their ``types`` filters take exact names (up to 20 a
request), not the ``customer.subscription.*`` patterns billing routes by, so
the names are those of :data:`STRIPE_EVENT_TYPES` and
:data:`STRIPE_THIN_EVENT_TYPES` that billing's routes handle, asked for in
groups of 20. Both lists count in one backfill report and one alert.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from app.billing.budget import stripe_gateway
from app.billing.stripe_gateway import StripeGateway
from app.core.resources import Resources
from app.webhooks.event_source import ListedEvent

# The event types Stripe sends under the prefixes billing handles (Stripe's API reference, "Types of events").
STRIPE_EVENT_TYPES = (
    "checkout.session.completed",
    "customer.subscription.created",
    "customer.subscription.updated",
    "customer.subscription.deleted",
    "customer.subscription.paused",
    "customer.subscription.resumed",
    "customer.subscription.trial_will_end",
    "customer.subscription.pending_update_applied",
    "customer.subscription.pending_update_expired",
    "invoice.paid",
    "invoice.payment_failed",
    "charge.dispute.created",
    "charge.dispute.updated",
    "charge.dispute.closed",
    "charge.dispute.funds_reinstated",
    "charge.dispute.funds_withdrawn",
    "charge.refunded",
    "refund.created",
    "refund.updated",
    "refund.failed",
    "radar.early_fraud_warning.created",
    "radar.early_fraud_warning.updated",
)
# The thin event types Stripe sends under the v1. prefixes billing handles. The stripe SDK knows them (each
# notification class's LOOKUP_TYPE) but only by importing some 160 modules (a third of a second):
# tests/billing/test_thin_events.py holds this list to the installed SDK's.
STRIPE_THIN_EVENT_TYPES = (
    "v1.checkout.session.completed",
    *(
        f"v1.customer.subscription.{name}"
        for name in (
            "active",
            "cancel_at_changed",
            "created",
            "default_payment_method_changed",
            "deleted",
            "incomplete",
            "incomplete_expired",
            "item_added",
            "item_price_changed",
            "item_quantity_changed",
            "item_removed",
            "item_tax_rates_changed",
            "past_due",
            "paused",
            "pending_update_applied",
            "pending_update_expired",
            "resumed",
            "trial_will_end",
            "trialing",
            "unpaid",
            "updated",
        )
    ),
    "v1.invoice.paid",
    "v1.invoice.payment_failed",
    *(f"v1.charge.dispute.{name}" for name in ("closed", "created", "funds_reinstated", "funds_withdrawn", "updated")),
    "v1.charge.refunded",
    "v1.refund.created",
    "v1.refund.failed",
    "v1.refund.updated",
    "v1.radar.early_fraud_warning.created",
    "v1.radar.early_fraud_warning.updated",
)
_TYPES_PER_REQUEST = 20


class StripeEventSource:
    label = "Stripe"

    def __init__(self, handles: Callable[[str], bool]) -> None:
        self.types = [name for name in STRIPE_EVENT_TYPES if handles(name)]
        self.thin_types = [name for name in STRIPE_THIN_EVENT_TYPES if handles(name)]

    async def pages(self, resources: Resources, since: datetime, until: datetime) -> AsyncIterator[list[ListedEvent]]:
        gateway, payloads = stripe_gateway(resources), resources.settings.stripe_event_payloads
        if "snapshot" in payloads:
            for group in _groups(self.types):
                async for page in _snapshot_pages(gateway, group, since, until):
                    yield page
        if "thin" in payloads:
            for group in _groups(self.thin_types):
                async for page in _thin_pages(gateway, group, since, until):
                    yield page


def _groups(types: Sequence[str]) -> list[Sequence[str]]:
    return [types[start : start + _TYPES_PER_REQUEST] for start in range(0, len(types), _TYPES_PER_REQUEST)]


async def _snapshot_pages(
    gateway: StripeGateway, types: Sequence[str], since: datetime, until: datetime
) -> AsyncIterator[list[ListedEvent]]:
    """``/v1/events``: paged by ``starting_after`` the last id."""
    window, after = (int(since.timestamp()), int(until.timestamp())), None
    while True:
        events, more = await gateway.events_page(types, *window, after)
        if events:
            yield [_listed(event, datetime.fromtimestamp(int(event["created"]), UTC)) for event in events]
        if not more or not events:
            return
        after = str(events[-1]["id"])


async def _thin_pages(
    gateway: StripeGateway, types: Sequence[str], since: datetime, until: datetime
) -> AsyncIterator[list[ListedEvent]]:
    """``/v2/core/events``: paged by the ``next_page_url`` each page gives, until one gives none (or is empty)."""
    next_page: str | None = None
    while True:
        events, next_page = await gateway.thin_events_page(types, since, until, next_page)
        if events:
            yield [_listed(event, datetime.fromisoformat(str(event["created"]))) for event in events]
        if next_page is None or not events:
            return


def _listed(event: dict[str, Any], created: datetime) -> ListedEvent:
    return ListedEvent(str(event["id"]), str(event["type"]), created, event)
