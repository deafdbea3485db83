"""Stripe's thin events (an event destination with thin payloads): each syncs what its snapshot twin syncs, and
coalesces with it: a read is made once per object whose customer billing does not know, once per customer."""

from __future__ import annotations

import asyncio
import typing
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import stripe
import stripe.events
from prometheus_client import REGISTRY
from sqlalchemy import select, text

from app.billing.events_api import STRIPE_THIN_EVENT_TYPES
from app.billing.handlers import STRIPE_EVENTS
from app.billing.models import BillingDispute, BillingFraudWarning, BillingRefund
from app.core.resources import Resources
from app.identity.models import Workspace
from app.testing import (
    process_delivery,
    read_inbox_row,
    signed_stripe_delivery,
    stripe_event,
    stripe_object,
    stripe_subscription,
    stripe_thin_event,
    stripe_thin_twin,
)
from app.testing.stripe_stub import StripeStub
from app.webhooks.inbox import Inbox
from app.webhooks.processing import process_event
from tests.billing.conftest import OpenResources, store, workspace_row
from tests.factories import WorkspaceFactory, persist

Scenario = Callable[[StripeStub, Workspace], dict[str, Any]]
"""Puts a scenario's objects in the stub (about the workspace's customer ``cus_thin``); returns the snapshot event."""


def subscription_changed(stub: StripeStub, workspace: Workspace) -> dict[str, Any]:
    sub = stub.put_subscription("cus_thin", id="sub_thin", quantity=7, status="trialing")
    return stripe_event("customer.subscription.updated", {**sub, "quantity": 1})


def subscription_deleted(stub: StripeStub, workspace: Workspace) -> dict[str, Any]:
    sub = stub.put_subscription("cus_thin", id="sub_thin", quantity=9, status="canceled")
    return stripe_event("customer.subscription.deleted", sub)


def invoice(event_type: str) -> Scenario:
    def scenario(stub: StripeStub, workspace: Workspace) -> dict[str, Any]:
        stub.put_subscription("cus_thin", id="sub_thin", quantity=4, status="past_due")
        return stripe_event(event_type, stub.put_invoice("in_thin", customer="cus_thin"))

    return scenario


def checkout_completed(stub: StripeStub, workspace: Workspace) -> dict[str, Any]:
    stub.put_subscription("cus_thin", id="sub_thin", quantity=6)
    reference = str(workspace.clerk_org_id)
    checkout = stub.put_checkout_session("cs_thin", customer="cus_thin", client_reference_id=reference)
    return stripe_event("checkout.session.completed", checkout)


def dispute_created(stub: StripeStub, workspace: Workspace) -> dict[str, Any]:
    stub.put_charge("ch_thin", customer="cus_thin", amount=4200, currency="eur")
    dispute = stub.put_dispute("dp_thin", charge="ch_thin", amount=4200, currency="eur", status="needs_response")
    return stripe_event("charge.dispute.created", {**dispute, "status": "stale-body"})


def charge_refunded(stub: StripeStub, workspace: Workspace) -> dict[str, Any]:
    charge = stub.put_charge("ch_thin", customer="cus_thin", amount=900, currency="usd")
    stub.put_refund("re_thin", charge="ch_thin", amount=300, currency="usd", status="succeeded")
    return stripe_event("charge.refunded", charge)


def refund_updated(stub: StripeStub, workspace: Workspace) -> dict[str, Any]:
    stub.put_charge("ch_thin", customer="cus_thin", amount=900, currency="usd")
    refund = stub.put_refund("re_thin", charge="ch_thin", amount=300, currency="usd", status="failed")
    return stripe_event("refund.updated", refund)


def fraud_warning_created(stub: StripeStub, workspace: Workspace) -> dict[str, Any]:
    stub.put_charge("ch_thin", customer="cus_thin", amount=5000, currency="usd")
    warning = stub.put_early_fraud_warning(
        "issfr_thin", charge="ch_thin", actionable=True, fraud_type="card_never_received"
    )
    return stripe_event("radar.early_fraud_warning.created", warning)


SCENARIOS: dict[str, Scenario] = {
    "v1.customer.subscription.updated": subscription_changed,
    "v1.customer.subscription.deleted": subscription_deleted,
    "v1.invoice.paid": invoice("invoice.paid"),
    "v1.invoice.payment_failed": invoice("invoice.payment_failed"),
    "v1.checkout.session.completed": checkout_completed,
    "v1.charge.dispute.created": dispute_created,
    "v1.charge.refunded": charge_refunded,
    "v1.refund.updated": refund_updated,
    "v1.radar.early_fraud_warning.created": fraud_warning_created,
}
BILLING_COLUMNS = (
    "stripe_customer_id",
    "subscription_id",
    "subscription_status",
    "price_id",
    "seat_quantity",
    "member_limit",
    "current_period_end",
    "cancel_at_period_end",
)
MIRRORS = (BillingDispute, BillingRefund, BillingFraudWarning)


async def billing_state(resources: Resources, workspace_id: int) -> dict[str, Any]:
    """What billing holds for the workspace: its billing columns and the mirrors of its objects."""
    row = await workspace_row(resources, workspace_id)
    state: dict[str, Any] = {column: getattr(row, column) for column in BILLING_COLUMNS}
    async with resources.db.session() as session:
        for model in MIRRORS:
            mirrored: Sequence[Any] = (await session.scalars(select(model).order_by(model.stripe_id))).all()
            state[model.__tablename__] = [
                (m.stripe_id, m.workspace_id, m.status, m.amount, m.currency, m.reason) for m in mirrored
            ]
    return state


async def forget(resources: Resources, workspace_id: int, customer: str | None) -> None:
    """Back to before the snapshot event: the workspace as it was, no mirror, no sync, an empty inbox."""
    async with resources.db.session() as session:
        for table in ("billing_dispute", "billing_refund", "billing_fraud_warning", "billing_sync", "webhook_event"):
            await session.execute(text(f"DELETE FROM {table}"))
        await session.execute(
            text(
                "UPDATE workspace SET stripe_customer_id = :customer, subscription_id = NULL, "
                "subscription_status = NULL, price_id = NULL, seat_quantity = NULL, member_limit = 3, "
                "current_period_end = NULL, cancel_at_period_end = false, billing_synced_at = NULL WHERE id = :id"
            ),
            {"customer": customer, "id": workspace_id},
        )
        await session.commit()


def requests_for(stub: StripeStub, prefix: str) -> list[str]:
    return [path for _, path in stub.requests if path.startswith(prefix)]


@pytest.mark.parametrize("thin_type", sorted(SCENARIOS))
async def test_each_handled_thin_type_syncs_the_state_its_snapshot_twin_syncs(
    worker: Resources, stripe_stub: StripeStub, webhook_secrets: dict[str, str], thin_type: str
) -> None:
    """Billing knows nothing of the object the thin event names (its twin's row is gone too): it is read."""
    linked = None if thin_type == "v1.checkout.session.completed" else "cus_thin"
    workspace = await persist(worker.db, WorkspaceFactory.build(stripe_customer_id=linked))
    stripe_stub.put_customer("cus_thin")
    snapshot = SCENARIOS[thin_type](stripe_stub, workspace)
    thin = stripe_thin_twin(snapshot)
    assert thin["type"] == thin_type
    secret = webhook_secrets["stripe"]
    before = await billing_state(worker, workspace.id)

    assert (await process_delivery(worker, signed_stripe_delivery(snapshot, secret))).processed
    by_snapshot = await billing_state(worker, workspace.id)
    await forget(worker, workspace.id, linked)
    asked_before = len(stripe_stub.requests)
    assert (await process_delivery(worker, signed_stripe_delivery(thin, secret))).processed

    assert by_snapshot != before  # the scenario changes something
    assert await billing_state(worker, workspace.id) == by_snapshot
    related = thin["related_object"]
    assert any(related["id"] in path for _, path in stripe_stub.requests[asked_before:])  # what it names was read


async def test_an_unknown_related_object_is_read_once_through_the_budget(
    worker: Resources, stripe_stub: StripeStub, webhook_secrets: dict[str, str]
) -> None:
    """Three thin events about a subscription billing never synced: the subscription is read once for its customer,
    then the customer once; each read passed the budget (its wait observed)."""
    workspace = await persist(worker.db, WorkspaceFactory.build(stripe_customer_id="cus_unknown"))
    stripe_stub.put_customer("cus_unknown")
    stripe_stub.put_subscription("cus_unknown", id="sub_unknown", quantity=8)
    rows = [
        await store(
            worker, signed_stripe_delivery(stripe_thin_event(thin_type, "sub_unknown"), webhook_secrets["stripe"])
        )
        for thin_type in ("v1.customer.subscription.created", "v1.customer.subscription.updated") * 2
    ]
    (record, *_) = await Inbox(worker.db).find(str(rows[0]))
    assert (record.tenant_key, record.sync_subject) == ("sub_unknown", "subscription:sub_unknown")
    waits_before = REGISTRY.get_sample_value("stripe_api_budget_wait_seconds_count") or 0.0

    await asyncio.gather(*(process_event(worker, row_id, "stripe") for row_id in rows))

    assert [path for _, path in stripe_stub.requests] == ["/v1/subscriptions/sub_unknown", "/v1/customers/cus_unknown"]
    assert (REGISTRY.get_sample_value("stripe_api_budget_wait_seconds_count") or 0.0) - waits_before == 2
    for row_id in rows:
        stored = await Inbox(worker.db).get(row_id)
        assert stored is not None and stored.processed_at is not None
    row = await workspace_row(worker, workspace.id)
    assert (row.subscription_id, row.seat_quantity, row.member_limit) == ("sub_unknown", 8, 8)


@pytest.mark.parametrize("known", [True, False], ids=["synced-subscription", "never-seen-subscription"])
async def test_a_burst_of_thin_events_about_one_subscription_costs_one_read_of_its_customer(
    open_resources: OpenResources, stripe_stub: StripeStub, webhook_secrets: dict[str, str], known: bool
) -> None:
    """40 thin events queued before any ran, four workers: a subscription billing synced costs one read (its
    customer's); one it never saw, one more (the subscription, for its customer)."""
    workers = [await open_resources() for _ in range(4)]
    workspace = await persist(
        workers[0].db,
        WorkspaceFactory.build(stripe_customer_id="cus_burst", subscription_id="sub_burst" if known else None),
    )
    stripe_stub.put_customer("cus_burst")
    stripe_stub.put_subscription("cus_burst", id="sub_burst", quantity=6)
    stripe_stub.slow("/v1/customers/cus_burst", seconds=0.5, times=1)
    secret = webhook_secrets["stripe"]
    types = ("v1.customer.subscription.updated", "v1.customer.subscription.item_quantity_changed")
    deliveries = [signed_stripe_delivery(stripe_thin_event(types[n % 2], "sub_burst"), secret) for n in range(40)]
    rows = [await store(workers[0], delivery) for delivery in deliveries]

    await asyncio.gather(*(process_event(workers[n % 4], row_id, "stripe") for n, row_id in enumerate(rows)))

    expected = ["/v1/customers/cus_burst"] if known else ["/v1/subscriptions/sub_burst", "/v1/customers/cus_burst"]
    assert [path for _, path in stripe_stub.requests] == expected
    records = [await Inbox(workers[0].db).get(row_id) for row_id in rows]
    assert all(record is not None and record.processed_at is not None for record in records)
    assert {record.tenant_key for record in records if record} == {"cus_burst" if known else "sub_burst"}
    assert (await workspace_row(workers[0], workspace.id)).member_limit == 6


@pytest.mark.parametrize("first", ["snapshot", "thin"])
@pytest.mark.parametrize("known", [True, False], ids=["synced-subscription", "never-seen-subscription"])
async def test_a_thin_event_and_its_snapshot_twin_arriving_together_cost_one_customer_read(
    open_resources: OpenResources, stripe_stub: StripeStub, webhook_secrets: dict[str, str], first: str, known: bool
) -> None:
    """Both destinations send the change (both rows stored, neither processed yet), two workers take one each."""
    workers = [await open_resources(), await open_resources()]
    workspace = await persist(
        workers[0].db,
        WorkspaceFactory.build(stripe_customer_id="cus_twin", subscription_id="sub_twin" if known else None),
    )
    stripe_stub.put_customer("cus_twin")
    stripe_stub.put_subscription("cus_twin", id="sub_twin", quantity=5)
    snapshot = stripe_event("customer.subscription.updated", stripe_subscription("cus_twin", id="sub_twin"))
    twins = {"snapshot": snapshot, "thin": stripe_thin_twin(snapshot)}
    order = [first, *(name for name in twins if name != first)]
    rows = [await store(workers[0], signed_stripe_delivery(twins[name], webhook_secrets["stripe"])) for name in order]

    await asyncio.gather(
        *(process_event(worker, row_id, "stripe") for worker, row_id in zip(workers, rows, strict=True))
    )

    assert requests_for(stripe_stub, "/v1/customers/") == ["/v1/customers/cus_twin"]
    for name in twins:
        row = await read_inbox_row(workers[0].db, "stripe", str(twins[name]["id"]))
        assert row is not None and row.processed, name
    assert (await workspace_row(workers[0], workspace.id)).member_limit == 5


async def test_an_event_whose_customer_was_read_after_it_arrived_costs_no_read(
    worker: Resources, stripe_stub: StripeStub, webhook_secrets: dict[str, str]
) -> None:
    """A thin event about a subscription billing never saw, processed after its customer was read: the subscription
    is read for the customer, whose read then covers the event."""
    await persist(worker.db, WorkspaceFactory.build(stripe_customer_id="cus_read"))
    stripe_stub.put_customer("cus_read")
    stripe_stub.put_subscription("cus_read", id="sub_read", quantity=2)
    secret = webhook_secrets["stripe"]
    thin = await store(
        worker, signed_stripe_delivery(stripe_thin_event("v1.customer.subscription.paused", "sub_read"), secret)
    )
    snapshot = stripe_event("invoice.paid", stripe_object("invoice", customer="cus_read"))
    await process_event(worker, await store(worker, signed_stripe_delivery(snapshot, secret)), "stripe")
    assert requests_for(stripe_stub, "/v1/customers/") == ["/v1/customers/cus_read"]

    await process_event(worker, thin, "stripe")

    assert requests_for(stripe_stub, "/v1/") == ["/v1/customers/cus_read", "/v1/subscriptions/sub_read"]
    record = await Inbox(worker.db).get(thin)
    assert record is not None and record.processed_at is not None


async def test_a_thin_dispute_billing_mirrored_takes_its_customers_turn(
    worker: Resources, stripe_stub: StripeStub, webhook_secrets: dict[str, str]
) -> None:
    """Billing holds the dispute (mirrored before, with its workspace): the thin event is its customer's tenant."""
    await persist(worker.db, WorkspaceFactory.build(stripe_customer_id="cus_dispute"))
    stripe_stub.put_charge("ch_dispute", customer="cus_dispute")
    stripe_stub.put_dispute("dp_known", charge="ch_dispute", status="needs_response")
    secret = webhook_secrets["stripe"]
    first = await process_delivery(
        worker, signed_stripe_delivery(stripe_thin_event("v1.charge.dispute.created", "dp_known"), secret)
    )
    later = await store(
        worker, signed_stripe_delivery(stripe_thin_event("v1.charge.dispute.updated", "dp_known"), secret)
    )

    (created,) = await Inbox(worker.db).find(first.event_id, "stripe")
    updated = await Inbox(worker.db).get(later)
    assert (created.tenant_key, created.sync_subject) == ("dp_known", "dispute:dp_known")  # not mirrored yet then
    assert updated is not None and (updated.tenant_key, updated.sync_subject) == ("cus_dispute", "dispute:dp_known")
    assert updated.related_object == "dispute dp_known"


def test_the_thin_types_the_backfill_asks_for_are_the_handled_ones_the_sdk_knows() -> None:
    """Every notification type of the installed stripe SDK that billing's routes handle, and only those."""
    names = [ref.__forward_arg__ for ref in typing.get_args(stripe.events.ALL_EVENT_NOTIFICATIONS)]
    sdk_types = {getattr(stripe.events, name).LOOKUP_TYPE for name in names}
    handled = {event_type for event_type in sdk_types if STRIPE_EVENTS.handles(event_type)}
    assert handled == set(STRIPE_THIN_EVENT_TYPES)
    assert len(STRIPE_THIN_EVENT_TYPES) == len(handled)
    assert "v2.core.event_destination.ping" in sdk_types and not STRIPE_EVENTS.handles("v2.core.event_destination.ping")


def test_the_test_kits_thin_events_are_what_the_sdk_parses_as_stripes(webhook_secrets: dict[str, str]) -> None:
    client = stripe.StripeClient("sk_test_123")
    secret = webhook_secrets["stripe"]
    for thin in (
        stripe_thin_event("v1.invoice.paid", "in_1"),
        stripe_thin_twin(stripe_event("charge.refunded", stripe_object("charge", id="ch_1"))),
    ):
        delivery = signed_stripe_delivery(thin, secret)
        notification: Any = client.parse_event_notification(delivery.body, delivery.headers["Stripe-Signature"], secret)
        assert not isinstance(notification, stripe.events.UnknownEventNotification)
        assert notification.type == thin["type"]
        assert (notification.related_object.id, notification.related_object.type) == (
            thin["related_object"]["id"],
            thin["related_object"]["type"],
        )
