"""The change journal of Stripe's syncs, the mirrors, the member limit job and billing reconciliation."""

from __future__ import annotations

from typing import Any

from app.billing.crons import BillingReconcileCronJob
from app.billing.models import BillingRefund
from app.core.journal import caused_by, event_cause
from app.core.resources import Resources
from app.identity.models import Workspace
from app.queue.cli import run_cron_now
from app.testing import process_delivery, signed_stripe_delivery, stripe_event, stripe_object
from app.testing.stripe_stub import StripeStub
from app.webhooks.inbox import InboxUpkeep
from app.webhooks.processing import process_event
from tests.billing.conftest import comes_back, event_try, store, subscription_delivery
from tests.billing.test_member_limit import _members_by_join_order
from tests.factories import WorkspaceFactory, persist
from tests.journal import journal


async def test_a_subscription_change_journals_the_columns_it_changed_naming_its_event(
    worker: Resources, stripe_stub: StripeStub, linked_workspace: Workspace, webhook_secrets: dict[str, str]
) -> None:
    secret = webhook_secrets["stripe"]
    period = {"price_id": "price_team", "current_period_end": 1_900_000_000}
    stripe_stub.put_subscription("cus_linked", id="sub_1", quantity=5, **period)
    first = await process_delivery(worker, subscription_delivery(secret, "cus_linked", id="sub_1", quantity=5))
    stripe_stub.put_subscription("cus_linked", id="sub_1", quantity=8, **period)
    second = await process_delivery(worker, subscription_delivery(secret, "cus_linked", id="sub_1", quantity=8))

    workspace = [change for change in await journal(worker.db) if change.entity == "workspace"]
    assert [change.source for change in workspace] == [
        event_cause(first.row_id),  # the subscription's columns
        event_cause(first.row_id),  # the member limit the seats paid for (identity's, in the same transaction)
        event_cause(second.row_id),
        event_cause(second.row_id),
    ]
    assert workspace[0].changes["subscription_id"] == [None, "sub_1"]
    assert workspace[0].changes["seat_quantity"] == [None, 5]
    assert "billing_synced_at" not in workspace[0].changes
    assert workspace[1].changes == {"member_limit": [3, 5]}
    assert workspace[2].changes == {"seat_quantity": [5, 8]}
    assert workspace[3].changes == {"member_limit": [5, 8]}
    assert {change.workspace_id for change in workspace} == {linked_workspace.id}


async def test_a_sync_that_reads_what_is_stored_journals_nothing(
    worker: Resources, stripe_stub: StripeStub, linked_workspace: Workspace, webhook_secrets: dict[str, str]
) -> None:
    """Its billing_synced_at moves, which is no change; a replay of the event is the same."""
    secret = webhook_secrets["stripe"]
    stripe_stub.put_subscription("cus_linked", id="sub_1", quantity=5)
    row = await process_delivery(worker, subscription_delivery(secret, "cus_linked", id="sub_1"))
    written = await journal(worker.db)

    await process_delivery(worker, subscription_delivery(secret, "cus_linked", id="sub_1"))  # another event, same state
    await InboxUpkeep(worker.db).reset_for_replay(row.row_id)
    await process_event(worker, row.row_id, "stripe")

    assert await journal(worker.db) == written
    assert len(stripe_stub.requests) == 3  # each read Stripe (the replay too: it asked after the last read)


async def test_one_read_covering_several_events_names_the_last_stored(
    worker: Resources, stripe_stub: StripeStub, linked_workspace: Workspace, webhook_secrets: dict[str, str]
) -> None:
    secret = webhook_secrets["stripe"]
    stripe_stub.put_subscription("cus_linked", id="sub_1", quantity=4)
    rows = [await store(worker, subscription_delivery(secret, "cus_linked", id="sub_1")) for _ in range(3)]
    assert await event_try(worker, rows[0]) is None  # one sync covers the three

    assert {change.source for change in await journal(worker.db)} == {event_cause(rows[-1])}


async def test_the_member_limit_job_journals_each_suspension_as_its_own(
    worker: Resources, stripe_stub: StripeStub, linked_workspace: Workspace, webhook_secrets: dict[str, str]
) -> None:
    members = await _members_by_join_order(worker, linked_workspace, 3)
    before = len(await journal(worker.db))
    stripe_stub.put_subscription("cus_linked", id="sub_1", quantity=1)
    await process_delivery(worker, subscription_delivery(webhook_secrets["stripe"], "cus_linked", id="sub_1"))

    suspensions = [change for change in (await journal(worker.db))[before:] if change.entity == "workspace_member"]
    assert [(change.source, change.entity_id, list(change.changes)) for change in suspensions] == [
        ("ApplyWorkspaceMemberLimitJob", member, ["suspended_at"]) for member in members[1:]
    ]
    assert all(change.changes["suspended_at"][0] is None for change in suspensions)


def _dispute(secret: str, event_type: str) -> Any:
    return signed_stripe_delivery(stripe_event(event_type, stripe_object("dispute", id="dp_1")), secret)


async def test_a_mirrored_dispute_journals_what_each_read_changed(
    worker: Resources, stripe_stub: StripeStub, linked_workspace: Workspace, webhook_secrets: dict[str, str]
) -> None:
    secret = webhook_secrets["stripe"]
    stripe_stub.put_charge("ch_1", customer="cus_linked")
    stripe_stub.put_dispute("dp_1", charge="ch_1", amount=4200, currency="eur", status="needs_response")
    created = await process_delivery(worker, _dispute(secret, "charge.dispute.created"))
    stripe_stub.put_dispute("dp_1", charge="ch_1", amount=4200, currency="eur", status="won")
    closed = await process_delivery(worker, _dispute(secret, "charge.dispute.closed"))

    first, second = await journal(worker.db, entity="billing_dispute")
    assert (first.source, first.workspace_id) == (event_cause(created.row_id), linked_workspace.id)
    assert first.changes["status"] == [None, "needs_response"] and first.changes["amount"] == [None, 4200]
    assert "synced_at" not in first.changes
    assert (second.source, second.entity_id, second.changes) == (
        event_cause(closed.row_id),
        first.entity_id,
        {"status": ["needs_response", "won"]},
    )


async def test_a_checkout_journals_the_customer_it_links(
    worker: Resources, stripe_stub: StripeStub, webhook_secrets: dict[str, str]
) -> None:
    workspace = await persist(worker.db, WorkspaceFactory.build())
    stripe_stub.put_customer("cus_new")
    stripe_stub.put_checkout_session("cs_1", customer="cus_new", client_reference_id=str(workspace.id))
    body = stripe_event("checkout.session.completed", stripe_object("checkout.session", id="cs_1"))
    row = await process_delivery(worker, signed_stripe_delivery(body, webhook_secrets["stripe"]))

    (link, *_) = await journal(worker.db)
    assert (link.source, link.entity_id, link.changes) == (
        event_cause(row.row_id),
        workspace.id,
        {"stripe_customer_id": [None, "cus_new"]},
    )


async def test_billing_reconciliation_journals_its_corrections_naming_the_cron(
    worker: Resources, stripe_stub: StripeStub, linked_workspace: Workspace
) -> None:
    stripe_stub.put_subscription("cus_linked", id="sub_1", quantity=6)

    await run_cron_now(worker, BillingReconcileCronJob)

    changes = await journal(worker.db)
    assert {change.source for change in changes} == {"BillingReconcileCronJob"}
    assert [list(change.changes) for change in changes][-1] == ["member_limit"]
    assert changes[0].changes["seat_quantity"] == [None, 6]


async def test_a_sync_that_came_back_journals_once_with_its_events_cause(
    worker: Resources, stripe_stub: StripeStub, linked_workspace: Workspace, webhook_secrets: dict[str, str]
) -> None:
    """A sync that failed once (a 5xx) and came back writes, and journals, once: the failed try left nothing."""
    stripe_stub.put_subscription("cus_linked", id="sub_1", quantity=2)
    stripe_stub.fail("/v1/customers/cus_linked", status=500, times=1)
    row = await store(worker, subscription_delivery(webhook_secrets["stripe"], "cus_linked", id="sub_1"))
    assert await event_try(worker, row) is not None  # the 5xx: it comes back after a backoff
    assert await journal(worker.db) == []

    assert await comes_back(worker, "customer:cus_linked") is None

    assert {change.source for change in await journal(worker.db, entity="workspace")} == {event_cause(row)}


async def test_a_journaled_models_flushes_journal_what_changed_and_its_deletion(
    worker: Resources, linked_workspace: Workspace
) -> None:
    """``Journaled`` (the one declaration a model of yours needs): inserts, changes and deletions through the
    session, with the cause of the unit of work; setting a column to the value it holds is no change."""
    with caused_by("a script of ours"):
        async with worker.db.session() as session:
            refund = BillingRefund(stripe_id="re_1", workspace_id=linked_workspace.id, status="pending", amount=500)
            session.add(refund)
            await session.commit()
            refund.status = "pending"
            await session.commit()
            refund.status = "succeeded"
            await session.commit()
            await session.delete(refund)
            await session.commit()

    created, succeeded, deleted = await journal(worker.db, entity="billing_refund")
    assert {created.source, succeeded.source, deleted.source} == {"a script of ours"}
    assert created.workspace_id == linked_workspace.id
    assert created.changes == {
        "stripe_id": [None, "re_1"],
        "status": [None, "pending"],
        "amount": [None, 500],
        "workspace_id": [None, linked_workspace.id],
    }
    assert succeeded.changes == {"status": ["pending", "succeeded"]}
    assert deleted.changes["status"] == ["succeeded", None] and deleted.changes["amount"] == [500, None]
