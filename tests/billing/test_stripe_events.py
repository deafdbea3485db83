"""Each handled Stripe event syncs what it names, from the Stripe API: checkouts, unlinked customers, mirrors."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from sqlalchemy import select

from app.billing.models import BillingDispute, BillingFraudWarning, BillingRefund
from app.core.resources import Resources
from app.identity.models import Workspace
from app.testing import process_delivery, read_inbox_row, signed_stripe_delivery, stripe_event, stripe_object
from app.testing.stripe_stub import StripeStub
from tests.billing.conftest import OpenResources, subscription_delivery, wait_for_stub_request, workspace_row
from tests.factories import WorkspaceFactory, persist


def _event(secret: str, event_type: str, kind: str, **fields: Any) -> Any:
    """An event whose body disagrees with Stripe on purpose: only its id may be used."""
    return signed_stripe_delivery(stripe_event(event_type, stripe_object(kind, status="stale-body", **fields)), secret)


@pytest.mark.parametrize("reference", ["clerk_org_id", "id"])
async def test_checkout_links_the_customer_to_the_workspace_it_names(
    worker: Resources, stripe_stub: StripeStub, webhook_secrets: dict[str, str], reference: str
) -> None:
    workspace = await persist(worker.db, WorkspaceFactory.build())
    stripe_stub.put_customer("cus_new")
    stripe_stub.put_subscription("cus_new", id="sub_new", quantity=9, status="trialing")
    stripe_stub.put_checkout_session("cs_1", customer="cus_new", client_reference_id=str(getattr(workspace, reference)))

    await process_delivery(
        worker, _event(webhook_secrets["stripe"], "checkout.session.completed", "checkout.session", id="cs_1")
    )

    row = await workspace_row(worker, workspace.id)
    assert (row.stripe_customer_id, row.subscription_id, row.subscription_status) == ("cus_new", "sub_new", "trialing")
    assert (row.seat_quantity, row.member_limit) == (9, 9)
    assert ("GET", "/v1/checkout/sessions/cs_1") in stripe_stub.requests


async def test_customer_linked_to_no_workspace_is_processed_with_nothing_to_sync(
    worker: Resources, stripe_stub: StripeStub, webhook_secrets: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="app.billing"):
        row = await process_delivery(worker, subscription_delivery(webhook_secrets["stripe"], "cus_stranger"))

    assert row.processed
    assert "Stripe customer cus_stranger is linked to no workspace: nothing to sync." in caplog.messages
    assert stripe_stub.requests == []


async def test_canceled_subscription_returns_the_workspace_to_the_free_limit(
    worker: Resources, stripe_stub: StripeStub, linked_workspace: Workspace, webhook_secrets: dict[str, str]
) -> None:
    stripe_stub.put_subscription("cus_linked", id="sub_1", quantity=10, status="canceled")

    await process_delivery(
        worker, subscription_delivery(webhook_secrets["stripe"], "cus_linked", "customer.subscription.deleted")
    )

    row = await workspace_row(worker, linked_workspace.id)
    assert (row.subscription_status, row.seat_quantity, row.member_limit) == ("canceled", 10, 3)


async def test_new_dispute_is_mirrored_as_read_and_warns_once(
    worker: Resources,
    stripe_stub: StripeStub,
    linked_workspace: Workspace,
    webhook_secrets: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = webhook_secrets["stripe"]
    stripe_stub.put_charge("ch_1", customer="cus_linked")
    stripe_stub.put_dispute(
        "dp_1", charge="ch_1", amount=4200, currency="eur", reason="fraudulent", status="needs_response"
    )

    with caplog.at_level(logging.WARNING, logger="app.billing"):
        await process_delivery(worker, _event(secret, "charge.dispute.created", "dispute", id="dp_1"))
        stripe_stub.put_dispute("dp_1", charge="ch_1", amount=4200, currency="eur", reason="fraudulent", status="won")
        await process_delivery(worker, _event(secret, "charge.dispute.closed", "dispute", id="dp_1"))

    (dispute,) = await _rows(worker, BillingDispute)
    assert (dispute.status, dispute.amount, dispute.currency, dispute.reason) == ("won", 4200, "eur", "fraudulent")
    assert dispute.workspace_id == linked_workspace.id
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "New Stripe dispute dp_1 for 4200 eur" in warning.getMessage()
    assert "submit evidence" in warning.getMessage()


async def test_refunds_of_a_refunded_charge_are_mirrored(
    worker: Resources, stripe_stub: StripeStub, linked_workspace: Workspace, webhook_secrets: dict[str, str]
) -> None:
    stripe_stub.put_charge("ch_1", customer="cus_linked")  # its refunds come expanded with it, as they are
    stripe_stub.put_refund("re_1", charge="ch_1", amount=500, currency="usd", status="succeeded")

    await process_delivery(worker, _event(webhook_secrets["stripe"], "charge.refunded", "charge", id="ch_1"))

    (refund,) = await _rows(worker, BillingRefund)
    assert (refund.stripe_id, refund.status, refund.amount, refund.workspace_id) == (
        "re_1",
        "succeeded",
        500,
        linked_workspace.id,
    )


async def test_early_fraud_warning_is_mirrored_with_its_charge_and_warns(
    worker: Resources,
    stripe_stub: StripeStub,
    linked_workspace: Workspace,
    webhook_secrets: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    stripe_stub.put_charge("ch_1", customer="cus_linked", amount=9900, currency="usd")
    stripe_stub.put_early_fraud_warning("issfr_1", charge="ch_1", actionable=True, fraud_type="card_never_received")

    with caplog.at_level(logging.WARNING, logger="app.billing"):
        await process_delivery(
            worker,
            _event(
                webhook_secrets["stripe"],
                "radar.early_fraud_warning.created",
                "radar.early_fraud_warning",
                id="issfr_1",
            ),
        )

    (warning_row,) = await _rows(worker, BillingFraudWarning)
    assert (warning_row.status, warning_row.reason, warning_row.amount) == ("actionable", "card_never_received", 9900)
    assert warning_row.workspace_id == linked_workspace.id
    assert any("New Stripe early fraud warning issfr_1" in message for message in caplog.messages)


async def _rows(resources: Resources, model: Any) -> list[Any]:
    async with resources.db.session() as session:
        return list((await session.scalars(select(model))).all())


async def test_a_dispute_arriving_while_a_checkout_links_its_customer_is_mirrored_with_the_workspace(
    open_resources: OpenResources, stripe_stub: StripeStub, webhook_secrets: dict[str, str]
) -> None:
    """Before the link commits, a lookup by customer finds no workspace: the dispute must wait for the checkout
    and name the workspace, not be mirrored as belonging to none."""
    checkout_worker, dispute_worker = await open_resources(), await open_resources()
    workspace = await persist(checkout_worker.db, WorkspaceFactory.build())
    stripe_stub.put_customer("cus_new")
    stripe_stub.put_subscription("cus_new", id="sub_1", quantity=2)
    stripe_stub.put_checkout_session("cs_1", customer="cus_new", client_reference_id=str(workspace.id))
    stripe_stub.put_charge("ch_1", customer="cus_new")
    stripe_stub.put_dispute("dp_1", charge="ch_1", amount=900, currency="usd", reason="fraudulent", status="won")
    stripe_stub.slow("/v1/customers/cus_new", seconds=0.5, times=1)  # the checkout holds its link 0.5 s
    secret = webhook_secrets["stripe"]
    checkout = signed_stripe_delivery(
        stripe_event("checkout.session.completed", stripe_object("checkout.session", id="cs_1")), secret
    )

    async def dispute_while_linking() -> None:
        # until the checkout has linked (uncommitted) and waits on its customer read
        await wait_for_stub_request(stripe_stub, "GET", "/v1/customers/cus_new")
        delivery = _event(secret, "charge.dispute.created", "dispute", id="dp_1")
        assert (await process_delivery(dispute_worker, delivery)).processed

    await asyncio.gather(process_delivery(checkout_worker, checkout), dispute_while_linking())

    (dispute,) = await _rows(dispute_worker, BillingDispute)
    assert dispute.workspace_id == workspace.id


async def test_a_refunded_charge_and_an_update_of_its_refund_lock_in_one_order(
    open_resources: OpenResources,
    stripe_stub: StripeStub,
    linked_workspace: Workspace,
    webhook_secrets: dict[str, str],
) -> None:
    """``charge.refunded`` locks every refund of the charge, ``refund.updated`` one of them; both also lock the
    customer. Taken in different orders, the two events would deadlock (Postgres 40P01) and one would fail its
    attempt: every billing transaction locks its customer first, then its mirror rows by id."""
    charge_worker, refund_worker = await open_resources(), await open_resources()
    stripe_stub.put_charge("ch_1", customer="cus_linked")
    for refund_id, amount in (("re_1", 500), ("re_2", 700)):
        stripe_stub.put_refund(refund_id, charge="ch_1", amount=amount, currency="usd", status="succeeded")
    stripe_stub.slow("/v1/refunds/re_2", seconds=0.5, times=1)  # the refund event's first read takes 0.5 s
    secret = webhook_secrets["stripe"]
    refund_event = _event(secret, "refund.updated", "refund", id="re_2")
    charge_event = _event(secret, "charge.refunded", "charge", id="ch_1")

    async def charge_while_the_refund_is_read() -> None:
        await wait_for_stub_request(stripe_stub, "GET", "/v1/refunds/re_2")
        await process_delivery(charge_worker, charge_event)

    outcomes = await asyncio.gather(
        process_delivery(refund_worker, refund_event), charge_while_the_refund_is_read(), return_exceptions=True
    )

    assert [repr(outcome) for outcome in outcomes if isinstance(outcome, BaseException)] == []
    for delivery in (refund_event, charge_event):
        row = await read_inbox_row(charge_worker.db, "stripe", delivery.event_id)
        assert row is not None and (row.processed, row.attempts, row.last_error) == (True, 1, None)
    mirrored = {(r.stripe_id, r.amount, r.workspace_id) for r in await _rows(charge_worker, BillingRefund)}
    assert mirrored == {("re_1", 500, linked_workspace.id), ("re_2", 700, linked_workspace.id)}
