"""A workspace's billing state is Stripe's current state, whatever the events' order, concurrency or faults."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from app.billing.budget import MAX_WAIT_SECONDS, BudgetExhaustedError, SlotLater, stripe_budget
from app.billing.sync import StripeSyncData, SyncComesBack, run_sync
from app.core.resources import Resources
from app.identity.models import Workspace
from app.queue.errors import RetryLater
from app.testing import process_delivery, signed_stripe_delivery, stripe_event, stripe_object
from app.testing.stripe_stub import StripeStub
from app.webhooks import operations
from app.webhooks.inbox import Inbox
from tests.billing.conftest import (
    OpenResources,
    comes_back,
    event_try,
    store,
    subscription_delivery,
    wait_for_stub_request,
    workspace_row,
)
from tests.factories import WorkspaceFactory, persist


async def test_out_of_order_subscription_events_end_at_stripes_current_state(
    worker: Resources, stripe_stub: StripeStub, linked_workspace: Workspace, webhook_secrets: dict[str, str]
) -> None:
    secret = webhook_secrets["stripe"]
    events = []
    for quantity in (2, 5, 8):  # the subscription's history; each change sends an event
        stripe_stub.put_subscription("cus_linked", id="sub_1", quantity=quantity)
        events.append(subscription_delivery(secret, "cus_linked", id="sub_1", quantity=quantity))

    for delivery, stripe_now in zip(reversed(events), (8, 4, 6), strict=True):  # newest first, oldest last
        stripe_stub.put_subscription("cus_linked", id="sub_1", quantity=stripe_now, price_id=f"price_{stripe_now}")
        assert (await process_delivery(worker, delivery)).processed

    row = await workspace_row(worker, linked_workspace.id)
    assert (row.subscription_id, row.subscription_status, row.seat_quantity) == ("sub_1", "active", 6)
    assert (row.member_limit, row.price_id) == (6, "price_6")


async def _wait_for_seats(resources: Resources, workspace_id: int, seats: int) -> None:
    for _ in range(200):
        if (await workspace_row(resources, workspace_id)).seat_quantity == seats:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the first sync never committed {seats} seats")


async def test_two_syncs_of_one_workspace_run_one_after_the_other(
    open_resources: OpenResources,
    stripe_stub: StripeStub,
    linked_workspace: Workspace,
    webhook_secrets: dict[str, str],
) -> None:
    """Two workers; an event sent while the first sync reads waits on the row lock, then reads the newer state."""
    first, second = await open_resources(), await open_resources()
    stripe_stub.put_subscription("cus_linked", id="sub_1", quantity=2)
    stripe_stub.slow("/v1/customers/cus_linked", seconds=0.5, times=2)  # each sync's read takes 0.5 s
    secret = webhook_secrets["stripe"]

    async def a_change_and_its_event_during_the_first_read() -> None:
        await wait_for_stub_request(stripe_stub, "GET", "/v1/customers/cus_linked")
        stripe_stub.put_subscription("cus_linked", id="sub_1", quantity=7)
        later = subscription_delivery(secret, "cus_linked", id="sub_1", quantity=7)
        assert (await process_delivery(second, later)).processed

    started = time.monotonic()
    await asyncio.gather(
        process_delivery(first, subscription_delivery(secret, "cus_linked", id="sub_1")),
        a_change_and_its_event_during_the_first_read(),
    )
    elapsed = time.monotonic() - started

    # One read each (the subscriptions come with the customer), one after the other: without the lock the
    # second would read while the first still writes, and the older state could be written last.
    assert [path for _, path in stripe_stub.requests] == ["/v1/customers/cus_linked"] * 2
    assert elapsed >= 1.0
    row = await workspace_row(first, linked_workspace.id)
    assert (row.seat_quantity, row.member_limit) == (7, 7)


async def test_an_event_arriving_while_a_checkout_links_its_customer_syncs_after_the_checkout(
    open_resources: OpenResources, stripe_stub: StripeStub, webhook_secrets: dict[str, str]
) -> None:
    """Before the link commits, a lookup by customer finds no workspace: the event must wait for the checkout,
    not be processed as "nothing to sync" (the change it announces would be lost: the checkout read earlier)."""
    checkout_worker, event_worker = await open_resources(), await open_resources()
    workspace = await persist(checkout_worker.db, WorkspaceFactory.build())
    stripe_stub.put_customer("cus_new")
    stripe_stub.put_subscription("cus_new", id="sub_1", quantity=2)
    stripe_stub.put_checkout_session("cs_1", customer="cus_new", client_reference_id=str(workspace.id))
    stripe_stub.slow("/v1/customers/cus_new", seconds=0.5, times=2)  # each sync's first read takes 0.5 s
    secret = webhook_secrets["stripe"]
    checkout = signed_stripe_delivery(
        stripe_event("checkout.session.completed", stripe_object("checkout.session", id="cs_1")), secret
    )

    async def event_while_linking() -> None:
        # until the checkout has linked (uncommitted) and waits on its customer read
        await wait_for_stub_request(stripe_stub, "GET", "/v1/customers/cus_new")
        assert (await process_delivery(event_worker, subscription_delivery(secret, "cus_new", id="sub_1"))).processed

    async def change_stripe_after_the_checkout_commits() -> None:
        await _wait_for_seats(checkout_worker, workspace.id, 2)
        stripe_stub.put_subscription("cus_new", id="sub_1", quantity=7)

    await asyncio.gather(
        process_delivery(checkout_worker, checkout), event_while_linking(), change_stripe_after_the_checkout_commits()
    )

    reads = [path for _, path in stripe_stub.requests]
    assert reads == ["/v1/checkout/sessions/cs_1", "/v1/customers/cus_new", "/v1/customers/cus_new"]
    row = await workspace_row(checkout_worker, workspace.id)
    assert (row.stripe_customer_id, row.seat_quantity, row.member_limit) == ("cus_new", 7, 7)


async def test_a_stripe_500_counts_an_attempt_and_the_sync_comes_back_then_processes(
    worker: Resources, stripe_stub: StripeStub, linked_workspace: Workspace, webhook_secrets: dict[str, str]
) -> None:
    stripe_stub.put_subscription("cus_linked", quantity=4)
    stripe_stub.fail("/v1/customers", status=500, times=1)
    row_id = await store(worker, subscription_delivery(webhook_secrets["stripe"], "cus_linked"))

    first = await event_try(worker, row_id)
    assert isinstance(first, SyncComesBack) and "HTTP 500" in str(first.__cause__)
    assert 0 < first.after_seconds <= 5 * 1.2  # the events' first backoff
    row = await Inbox(worker.db).get(row_id)
    assert row is not None and row.processed_at is None and row.attempts == 1
    assert row.last_error is not None and "HTTP 500" in row.last_error

    assert await comes_back(worker, "customer:cus_linked") is None  # the sync's job, after its backoff
    row = await Inbox(worker.db).get(row_id)
    assert row is not None and row.processed_at is not None and row.attempts == 2 and row.last_error is None
    assert (await workspace_row(worker, linked_workspace.id)).seat_quantity == 4


async def test_a_stripe_429_pauses_the_budget_and_the_sync_comes_back_without_counting_an_attempt(
    worker: Resources, stripe_stub: StripeStub, linked_workspace: Workspace, webhook_secrets: dict[str, str]
) -> None:
    """A sync holds its locks while it reads: told to wait, it gives them back and its job comes back after the
    pause, which every process keeps; the event's attempts and last error are left as they were."""
    stripe_stub.put_subscription("cus_linked", quantity=4)
    stripe_stub.rate_limit("/v1/customers", retry_after=60, times=1)
    row_id = await store(worker, subscription_delivery(webhook_secrets["stripe"], "cus_linked"))

    started = time.monotonic()
    first = await event_try(worker, row_id)
    assert time.monotonic() - started < 5  # not waited out holding the sync's locks
    assert isinstance(first, RetryLater) and first.after_seconds == 60
    row = await Inbox(worker.db).get(row_id)
    assert row is not None and row.processed_at is None and row.attempts == 0 and row.last_error is None
    budget = stripe_budget(worker)
    assert 50 < await budget.paused_seconds() <= 60  # every process waits out the Retry-After

    await budget.pause(0.001)  # the Retry-After is over
    await asyncio.sleep(0.01)
    assert await comes_back(worker, "customer:cus_linked") is None
    row = await Inbox(worker.db).get(row_id)
    assert row is not None and row.processed_at is not None and row.attempts == 1 and row.last_error is None
    assert [path for _, path in stripe_stub.requests] == ["/v1/customers/cus_linked"] * 2
    assert (await workspace_row(worker, linked_workspace.id)).seat_quantity == 4


async def test_a_sync_whose_reservation_is_far_comes_back_for_it_holding_nothing_and_counting_no_attempt(
    worker: Resources, stripe_stub: StripeStub, linked_workspace: Workspace, webhook_secrets: dict[str, str]
) -> None:
    stripe_stub.put_subscription("cus_linked", quantity=3)
    budget = stripe_budget(worker)
    await budget.pause(MAX_WAIT_SECONDS + 30)  # another process was told to wait (a 429): no slot for 45 s
    row_id = await store(worker, subscription_delivery(webhook_secrets["stripe"], "cus_linked"))

    first = await event_try(worker, row_id)
    assert isinstance(first, SlotLater) and 40 < first.after_seconds <= 45  # back when the pause is over
    assert stripe_stub.requests == []
    row = await Inbox(worker.db).get(row_id)
    assert row is not None and row.processed_at is None and row.attempts == 0 and row.last_error is None
    with pytest.raises(BudgetExhaustedError):  # a caller without a reservation (a command) gives up at once
        await budget.acquire()

    await budget.pause(0.001)  # the pause is over
    await asyncio.sleep(0.01)
    assert await comes_back(worker, "customer:cus_linked") is None
    row = await Inbox(worker.db).get(row_id)
    assert row is not None and row.processed_at is not None and row.attempts == 1 and row.last_error is None


async def test_stripe_404_sets_aside_every_event_the_sync_covers_with_one_alert(
    worker: Resources,
    stripe_stub: StripeStub,
    linked_workspace: Workspace,
    webhook_secrets: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    stripe_stub.remove("customer", "cus_linked")
    secret = webhook_secrets["stripe"]
    rows = [await store(worker, subscription_delivery(secret, "cus_linked")) for _ in range(3)]

    with caplog.at_level(logging.ERROR, logger="app.webhooks.coverage"):
        assert await event_try(worker, rows[0]) is None  # not retried: the sync ended

    for row_id in rows:
        row = await Inbox(worker.db).get(row_id)
        assert row is not None and row.processed_at is None and row.abandoned_at is not None and row.attempts == 1
        assert row.last_error is not None
        assert row.last_error.startswith("PermanentError: Stripe answered reading customer cus_linked: No such")
        assert "(HTTP 404: not retried)" in row.last_error
    (alert,) = [record.getMessage() for record in caplog.records]
    assert alert.startswith("3 webhook events set aside: the read of customer:cus_linked failed for good")
    assert [path for _, path in stripe_stub.requests] == ["/v1/customers/cus_linked"]  # one read for the three
    assert await event_try(worker, rows[1]) is None and len(stripe_stub.requests) == 1  # set aside: nothing asks


async def test_stripe_timeout_is_retried(
    open_resources: OpenResources,
    stripe_stub: StripeStub,
    linked_workspace: Workspace,
    webhook_secrets: dict[str, str],
) -> None:
    worker = await open_resources(STRIPE_API_TIMEOUT_SECONDS="0.3")
    stripe_stub.put_subscription("cus_linked", quantity=5)
    stripe_stub.slow("/v1/customers", seconds=1.0, times=1)
    row_id = await store(worker, subscription_delivery(webhook_secrets["stripe"], "cus_linked"))

    first = await event_try(worker, row_id)
    assert isinstance(first, SyncComesBack) and "within 0.3s" in str(first.__cause__)
    assert await comes_back(worker, "customer:cus_linked") is None

    assert (await workspace_row(worker, linked_workspace.id)).seat_quantity == 5


async def test_an_operators_retry_reads_now_and_the_sync_waiting_out_its_backoff_finds_itself_superseded(
    worker: Resources, stripe_stub: StripeStub, linked_workspace: Workspace, webhook_secrets: dict[str, str]
) -> None:
    stripe_stub.put_subscription("cus_linked", quantity=7)
    stripe_stub.fail("/v1/customers", status=500, times=1)
    row_id = await store(worker, subscription_delivery(webhook_secrets["stripe"], "cus_linked"))
    assert isinstance(await event_try(worker, row_id), SyncComesBack)  # waits out its backoff now

    outcome = await operations.retry(worker, str(row_id))  # the sync driver runs the new read inline

    assert outcome.message.endswith(": customer:cus_linked is read again at the budget's next free slots.")
    row = await Inbox(worker.db).get(row_id)
    assert row is not None and row.processed_at is not None and row.attempts == 2
    assert (await workspace_row(worker, linked_workspace.id)).seat_quantity == 7
    superseded = StripeSyncData("customer:cus_linked", generation=1, calls=1)
    await run_sync(worker, superseded)  # the first generation's job, back after its backoff: nothing to do
    assert [path for _, path in stripe_stub.requests] == ["/v1/customers/cus_linked"] * 2
