"""A workspace's billing state is Stripe's current state, whatever the events' order, concurrency or faults."""

from __future__ import annotations

import asyncio
import time

import pytest
from arq import Retry

from app.billing.budget import MAX_WAIT_SECONDS, BudgetExhaustedError, BudgetParked
from app.billing.stripe_gateway import stripe_gateway
from app.core.resources import Resources
from app.identity.models import Workspace
from app.queue.errors import PermanentError, RetryLater
from app.testing import process_delivery, read_inbox_row, signed_stripe_delivery, stripe_event, stripe_object
from app.testing.stripe_stub import StripeStub
from tests.billing.conftest import (
    OpenResources,
    subscription_delivery,
    wait_for_stub_request,
    worker_try,
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


async def test_a_stripe_500_is_retried_then_processed(
    worker: Resources, stripe_stub: StripeStub, linked_workspace: Workspace, webhook_secrets: dict[str, str]
) -> None:
    stripe_stub.put_subscription("cus_linked", quantity=4)
    stripe_stub.fail("/v1/customers", status=500, times=1)
    delivery = subscription_delivery(webhook_secrets["stripe"], "cus_linked")

    first = await worker_try(worker, delivery, attempt=1)
    assert isinstance(first, Retry) and "HTTP 500" in str(first.__cause__)
    assert await worker_try(worker, delivery, attempt=2) is None

    row = await read_inbox_row(worker.db, "stripe", delivery.event_id)
    assert row is not None and row.processed and row.attempts == 2 and row.last_error is None
    assert (await workspace_row(worker, linked_workspace.id)).seat_quantity == 4


async def test_a_stripe_429_is_waited_out_within_the_attempt_not_counted_as_a_failure(
    worker: Resources, stripe_stub: StripeStub, linked_workspace: Workspace, webhook_secrets: dict[str, str]
) -> None:
    stripe_stub.put_subscription("cus_linked", quantity=4)
    stripe_stub.rate_limit("/v1/customers", retry_after=1, times=1)
    delivery = subscription_delivery(webhook_secrets["stripe"], "cus_linked")

    started = time.monotonic()
    assert await worker_try(worker, delivery, attempt=1) is None  # no Retry: the same attempt went on
    assert time.monotonic() - started >= 1.0  # Stripe's Retry-After was waited out

    row = await read_inbox_row(worker.db, "stripe", delivery.event_id)
    assert row is not None and row.processed and row.attempts == 1 and row.last_error is None
    assert [path for _, path in stripe_stub.requests] == ["/v1/customers/cus_linked"] * 2
    assert (await workspace_row(worker, linked_workspace.id)).seat_quantity == 4


async def test_a_429_longer_than_an_attempt_may_wait_is_retried_later_without_counting_an_attempt(
    worker: Resources, stripe_stub: StripeStub, linked_workspace: Workspace, webhook_secrets: dict[str, str]
) -> None:
    """Retry-After past MAX_WAIT_SECONDS (15 s): the gateway pauses the fleet's budget for it and raises RetryLater
    at once instead of holding the attempt's transaction; the attempt is given back, no error recorded, and the
    event is processed once the pause is over."""
    stripe_stub.put_subscription("cus_linked", quantity=4)
    stripe_stub.rate_limit("/v1/customers", retry_after=60, times=1)
    delivery = subscription_delivery(webhook_secrets["stripe"], "cus_linked")

    started = time.monotonic()
    first = await worker_try(worker, delivery, attempt=1)
    assert time.monotonic() - started < MAX_WAIT_SECONDS  # not waited out within the attempt
    assert isinstance(first, Retry) and isinstance(first.__cause__, RetryLater)
    row = await read_inbox_row(worker.db, "stripe", delivery.event_id)
    assert row is not None and not row.processed and row.attempts == 0 and row.last_error is None
    budget = stripe_gateway(worker).budget
    assert 50 < await budget.paused_seconds() <= 60  # every process waits out the Retry-After

    await budget.pause(0.001)  # the Retry-After is over
    await asyncio.sleep(0.01)
    assert await worker_try(worker, delivery, attempt=2) is None
    row = await read_inbox_row(worker.db, "stripe", delivery.event_id)
    assert row is not None and row.processed and row.attempts == 1 and row.last_error is None
    assert (await workspace_row(worker, linked_workspace.id)).seat_quantity == 4


async def test_a_budget_paused_longer_than_a_read_may_wait_parks_the_event_without_counting_an_attempt(
    worker: Resources, stripe_stub: StripeStub, linked_workspace: Workspace, webhook_secrets: dict[str, str]
) -> None:
    stripe_stub.put_subscription("cus_linked", quantity=3)
    budget = stripe_gateway(worker).budget
    await budget.pause(MAX_WAIT_SECONDS + 30)  # another process was told to wait (a 429): no slot for 45 s
    delivery = subscription_delivery(webhook_secrets["stripe"], "cus_linked")

    first = await worker_try(worker, delivery, attempt=1)
    assert isinstance(first, Retry) and isinstance(first.__cause__, BudgetParked)
    assert 40 < (first.defer_score or 0) / 1000 <= 45  # back when the pause is over
    assert stripe_stub.requests == []
    row = await read_inbox_row(worker.db, "stripe", delivery.event_id)
    assert row is not None and not row.processed and row.attempts == 0 and row.last_error is None
    with pytest.raises(BudgetExhaustedError):  # a caller that may not park (a command) gives up at once
        await budget.acquire()

    await budget.pause(0.001)  # the pause is over
    await asyncio.sleep(0.01)
    assert await worker_try(worker, delivery, attempt=2) is None
    row = await read_inbox_row(worker.db, "stripe", delivery.event_id)
    assert row is not None and row.processed and row.attempts == 1 and row.last_error is None


async def test_stripe_404_for_the_customer_is_permanent_and_not_retried(
    worker: Resources, stripe_stub: StripeStub, linked_workspace: Workspace, webhook_secrets: dict[str, str]
) -> None:
    stripe_stub.remove("customer", "cus_linked")
    delivery = subscription_delivery(webhook_secrets["stripe"], "cus_linked")

    outcome = await worker_try(worker, delivery, attempt=1)

    assert isinstance(outcome, PermanentError)  # not arq.Retry: the worker does not run it again
    row = await read_inbox_row(worker.db, "stripe", delivery.event_id)
    assert row is not None and not row.processed and row.attempts == 1
    assert row.last_error is not None
    assert row.last_error.startswith("PermanentError: Stripe answered reading customer cus_linked: No such customer")
    assert "(HTTP 404: not retried)" in row.last_error


async def test_stripe_timeout_is_retried(
    open_resources: OpenResources,
    stripe_stub: StripeStub,
    linked_workspace: Workspace,
    webhook_secrets: dict[str, str],
) -> None:
    worker = await open_resources(STRIPE_API_TIMEOUT_SECONDS="0.3")
    stripe_stub.put_subscription("cus_linked", quantity=5)
    stripe_stub.slow("/v1/customers", seconds=1.0, times=1)
    delivery = subscription_delivery(webhook_secrets["stripe"], "cus_linked")

    first = await worker_try(worker, delivery, attempt=1)
    assert isinstance(first, Retry) and "within 0.3s" in str(first.__cause__)
    assert await worker_try(worker, delivery, attempt=2) is None

    assert (await workspace_row(worker, linked_workspace.id)).seat_quantity == 5
