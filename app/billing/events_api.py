"""Stripe's Events API as the backfill's source: the handled events Stripe still lists, newest first.

Stripe keeps events 30 days. Its ``types[]`` filter takes exact names (up to
20 a request), not the ``customer.subscription.*`` patterns billing routes
by, so the names are those of :data:`STRIPE_EVENT_TYPES` (the event types
Stripe sends) that billing's routes handle, asked for in groups of 20.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

from app.billing.stripe_gateway import stripe_gateway
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
_TYPES_PER_REQUEST = 20


class StripeEventSource:
    label = "Stripe"

    def __init__(self, handles: Callable[[str], bool]) -> None:
        self.types = [name for name in STRIPE_EVENT_TYPES if handles(name)]

    async def pages(self, resources: Resources, since: datetime, until: datetime) -> AsyncIterator[list[ListedEvent]]:
        gateway = stripe_gateway(resources)
        window = (int(since.timestamp()), int(until.timestamp()))
        for start in range(0, len(self.types), _TYPES_PER_REQUEST):
            group, after = self.types[start : start + _TYPES_PER_REQUEST], None
            while True:
                events, more = await gateway.events_page(group, *window, after)
                if events:
                    yield [_listed(event) for event in events]
                if not more or not events:
                    break
                after = str(events[-1]["id"])


def _listed(event: dict[str, Any]) -> ListedEvent:
    created = datetime.fromtimestamp(int(event["created"]), UTC)
    return ListedEvent(str(event["id"]), str(event["type"]), created, event)
