"""Stripe events: each says only WHICH customer, dispute, refund or fraud warning changed.

The state itself is read from the Stripe API under a row lock (see
``services``): an event body may be old, repeated or out of order, the API's
answer is current. The write commits with the event's ``processed_at``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from app.billing.events_api import StripeEventSource
from app.billing.mirrors import sync_mirror, sync_refunds_of_charge
from app.billing.services import BillingSync, link_checkout, sync_customer
from app.billing.stripe_gateway import stripe_gateway
from app.identity.seats import set_member_limit
from app.queue.errors import PermanentError
from app.webhooks.handlers import EventRoutes, WebhookContext

logger = logging.getLogger(__name__)


def _object_link(context: WebhookContext, name: str) -> str:
    """An id the event's ``data.object`` carries (itself for ``id``); an expanded link gives its ``id``."""
    obj: Mapping[str, Any] = context.payload.get("data", {}).get("object") or {}
    value = obj.get(name)
    if isinstance(value, Mapping):
        value = value.get("id")
    if not isinstance(value, str) or not value:
        raise PermanentError(
            f"Stripe {context.event.type} event {context.event.event_id} has no data.object.{name}: "
            "nothing says what changed."
        )
    return value


async def _after_sync(context: WebhookContext, result: BillingSync | None) -> None:
    """Billing says how many seats are paid for; identity, which owns seats, applies a change after the commit."""
    if result is not None:
        await set_member_limit(
            context.session,
            context.resources.queue,
            result.workspace_id,
            result.paid_seats,
            cause=context.event.event_id,
        )


async def _customer_changed(context: WebhookContext) -> None:
    customer_id = _object_link(context, "customer")
    settings = context.resources.settings
    received_at = context.event.received_at if settings.billing_coalesce_reads else None
    result = await sync_customer(
        context.session,
        stripe_gateway(context.resources),
        customer_id,
        settings.free_plan_member_limit,
        received_at=received_at,
        may_park=True,  # a burst or backlog of reads parks in the budget instead of holding the worker's slots
    )
    await _after_sync(context, result)


async def _checkout_completed(context: WebhookContext) -> None:
    session_id = _object_link(context, "id")
    gateway, free_limit = stripe_gateway(context.resources), context.resources.settings.free_plan_member_limit
    await _after_sync(context, await link_checkout(context.session, gateway, session_id, free_limit))


async def _dispute_changed(context: WebhookContext) -> None:
    await sync_mirror(context.session, stripe_gateway(context.resources), "dispute", _object_link(context, "id"))


async def _refund_changed(context: WebhookContext) -> None:
    await sync_mirror(context.session, stripe_gateway(context.resources), "refund", _object_link(context, "id"))


async def _charge_refunded(context: WebhookContext) -> None:
    """The event names the charge; its refunds (as Stripe lists them now) are each mirrored."""
    charge_id = _object_link(context, "id")
    await sync_refunds_of_charge(context.session, stripe_gateway(context.resources), charge_id)


async def _fraud_warning_changed(context: WebhookContext) -> None:
    warning_id = _object_link(context, "id")
    await sync_mirror(context.session, stripe_gateway(context.resources), "early_fraud_warning", warning_id)


# The Stripe events billing handles (docs/deploy.md lists them to subscribe to), and so the ones the intake stores.
_ROUTES = EventRoutes(
    {
        "checkout.session.completed": _checkout_completed,
        "customer.subscription.*": _customer_changed,
        "invoice.paid": _customer_changed,
        "invoice.payment_failed": _customer_changed,
        "charge.dispute.*": _dispute_changed,
        "charge.refunded": _charge_refunded,
        "refund.*": _refund_changed,
        "radar.early_fraud_warning.*": _fraud_warning_changed,
    }
)
# With the Events API as its backfill source (only the types routed above are asked for).
STRIPE_EVENTS = EventRoutes(_ROUTES.routes, backfill=StripeEventSource(_ROUTES.handles))
