"""Stripe down for everyone holds the ``stripe`` upstream: nothing set aside however long, one alert, one probe per
interval, then every event processed with Stripe's state. One customer failing alone is no outage."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from app.billing.budget import STRIPE
from app.billing.sync import SyncComesBack
from app.core.resources import Resources
from app.core.sentry import init_sentry
from app.queue.upstreams import UpstreamHeld
from app.testing import signed_stripe_delivery, stripe_event, stripe_object
from app.testing.stripe_stub import StripeStub
from app.webhooks.inbox import Inbox
from app.webhooks.maintenance import recover
from tests.billing.conftest import (
    OpenResources,
    comes_back,
    event_try,
    health_checks_since,
    store,
    subscription_delivery,
    workspace_row,
)
from tests.billing.test_stripe_budget import most_in_window
from tests.factories import WorkspaceFactory, persist
from tests.stubs.sentry_ingest import SentryIngestStub

PROBE_SECONDS = 0.3
CLOCK_SLACK_SECONDS = 0.01  # the gate times probes by Redis's clock, the stub its requests by this process's
# One round of retries is two tries, and the recovery cron sets aside an event at its second attempt: a provider
# down for a few probe intervals outlasts the whole retry window many times over.
SHORT_RETRY_WINDOW = {
    "WEBHOOK_RETRY_LIMIT": "1",
    "WEBHOOK_ABANDON_AFTER_ATTEMPTS": "2",
    "WEBHOOK_RECOVERY_AFTER_SECONDS": "0",
    "UPSTREAM_PROBE_SECONDS": str(PROBE_SECONDS),
}


async def linked(resources: Resources, stub: StripeStub, customers: list[str]) -> list[int]:
    """A workspace per customer, each with a subscription of 2 seats in the stub; their ids."""
    ids = []
    for customer in customers:
        stub.put_customer(customer)
        stub.put_subscription(customer, quantity=2)
        ids.append((await persist(resources.db, WorkspaceFactory.build(stripe_customer_id=customer))).id)
    return ids


async def rows_of(resources: Resources, rows: list[int]) -> list[Any]:
    return [await Inbox(resources.db).get(row_id) for row_id in rows]


def assert_one_health_check_per_probe_interval(stub: StripeStub) -> None:
    """From the health check that confirmed the hold (the fourth request) on, Stripe is asked nothing but the
    probes' health checks, at least a probe interval apart. Held by the requests' times, not by their count in a
    stretch of wall time, which a busy machine stretches."""
    checks = health_checks_since(stub, 3)
    assert most_in_window(checks, PROBE_SECONDS - CLOCK_SLACK_SECONDS) == 1, checks


def hold_alerts(sentry: SentryIngestStub) -> list[dict[str, Any]]:
    return [e for e in sentry.events if "exception" not in e and "Upstream stripe is held" in str(e)]


def sync_errors(sentry: SentryIngestStub) -> list[dict[str, Any]]:
    """The errors a failed sync reports, one per attempt it counts (the sync driver reports its job's too)."""
    return [e for e in sentry.events if "exception" in e and "stripe.subject" in e.get("tags", {})]


async def test_stripe_down_for_everyone_holds_after_three_customers_and_sets_nothing_aside_however_long(
    open_resources: OpenResources,
    stripe_stub: StripeStub,
    webhook_secrets: dict[str, str],
    sentry_enabled: SentryIngestStub,
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker = await open_resources(**SHORT_RETRY_WINDOW, SENTRY_DSN=sentry_enabled.dsn)
    init_sentry(worker.settings, "worker")
    customers = [f"cus_outage_{n}" for n in range(6)]
    workspaces = await linked(worker, stripe_stub, customers)
    stripe_stub.fail("/v1", status=500, times=None)  # every call, for as long as it lasts
    rows = [await store(worker, subscription_delivery(webhook_secrets["stripe"], customer)) for customer in customers]

    with caplog.at_level(logging.ERROR, logger="app.queue.upstreams.calls"):
        tried = [await event_try(worker, row_id) for row_id in rows]
    assert [type(exc) for exc in tried] == [SyncComesBack, SyncComesBack, *[UpstreamHeld] * 4]
    # The third failure, confirmed by Stripe's health check (an event list) failing too, held it: the last three
    # asked nothing but a probe when one fell due (none unless the machine is slow: the interval is short).
    assert [path for _, path in stripe_stub.requests][2:4] == ["/v1/customers/cus_outage_2", "/v1/events"]
    assert_one_health_check_per_probe_interval(stripe_stub)
    assert [row.attempts for row in await rows_of(worker, rows)] == [1, 1, 0, 0, 0, 0]
    (alert,) = [r.getMessage() for r in caplog.records if r.name == "app.queue.upstreams.calls"]
    assert alert.startswith("Upstream stripe is held: 3 different subjects failed in a row")
    assert "HTTP 500" in alert
    status = await STRIPE.of(worker).status()
    assert status.state == "held" and status.last_error is not None and "HTTP 500" in status.last_error

    cron = await open_resources(**SHORT_RETRY_WINDOW, MESSAGE_QUEUE_DRIVER="arq")  # the recovery cron's process
    for _ in range(8):  # many times the retry window: each sync comes back, the recovery cron runs
        await asyncio.sleep(PROBE_SECONDS + 0.05)
        for customer in customers:
            assert isinstance(await comes_back(worker, f"customer:{customer}"), UpstreamHeld)
        await recover(cron)
    assert all(row.abandoned_at is None for row in await rows_of(worker, rows))
    assert [row.attempts for row in await rows_of(worker, rows)] == [1, 1, 0, 0, 0, 0]
    assert len(stripe_stub.requests) >= 4 + 6  # a probe in (nearly) every one of the 8 intervals
    assert_one_health_check_per_probe_interval(stripe_stub)  # and never more than one per interval
    sentry_enabled.wait_for(lambda events: len(hold_alerts(sentry_enabled)) >= 1)
    assert len(hold_alerts(sentry_enabled)) == 1 and len(sync_errors(sentry_enabled)) == 2  # the two tries before it

    stripe_stub.clear_faults()  # Stripe answers again
    await asyncio.sleep(PROBE_SECONDS + 0.05)
    for customer in customers:
        assert await comes_back(worker, f"customer:{customer}") is None
    assert all(row.processed_at is not None and row.abandoned_at is None for row in await rows_of(worker, rows))
    assert [(await workspace_row(worker, workspace)).seat_quantity for workspace in workspaces] == [2] * 6
    assert (await STRIPE.of(worker).status()).state == "ok"
    assert len(hold_alerts(sentry_enabled)) == 1 and len(sync_errors(sentry_enabled)) == 2


async def test_a_few_objects_failing_while_nothing_else_is_read_hold_nothing_when_stripe_answers(
    open_resources: OpenResources,
    stripe_stub: StripeStub,
    webhook_secrets: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Three disputes Stripe answers 500 for, and no other read between: as many distinct subjects as an outage,
    but Stripe's health check answers, so they retry and are set aside as one object failing alone would be."""
    worker = await open_resources(**SHORT_RETRY_WINDOW)
    for dispute in ("dp_1", "dp_2", "dp_3"):
        stripe_stub.fail(f"/v1/disputes/{dispute}", status=500, times=None)
    secret = webhook_secrets["stripe"]
    rows = [
        await store(
            worker,
            signed_stripe_delivery(stripe_event("charge.dispute.created", stripe_object("dispute", id=d)), secret),
        )
        for d in ("dp_1", "dp_2", "dp_3")
    ]
    with caplog.at_level(logging.INFO, logger="app.queue.upstreams.calls"):
        tried = [await event_try(worker, row_id) for row_id in rows]
    assert [type(exc) for exc in tried] == [SyncComesBack] * 3  # each spent an attempt: no hold
    assert (await STRIPE.of(worker).status()).state == "ok"
    (said,) = [r.getMessage() for r in caplog.records if r.name == "app.queue.upstreams.calls"]
    assert said.startswith("Upstream stripe: 3 different subjects failed in a row, but it answers its health check")
    for dispute in ("dp_1", "dp_2", "dp_3"):
        assert await comes_back(worker, f"dispute:{dispute}") is None  # a second failure: its round is over
    assert [row.attempts for row in await rows_of(worker, rows)] == [2, 2, 2]
    await recover(await open_resources(**SHORT_RETRY_WINDOW, MESSAGE_QUEUE_DRIVER="arq"))
    assert all(row.abandoned_at is not None for row in await rows_of(worker, rows))


async def test_one_customer_failing_while_others_succeed_is_set_aside_as_before_and_never_holds(
    open_resources: OpenResources,
    stripe_stub: StripeStub,
    webhook_secrets: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two distinct failures would hold it: a flaky customer's one failure, between the failing customer's,
    is never in a row with them, since the others' successes come between."""
    worker = await open_resources(
        **{**SHORT_RETRY_WINDOW, "UPSTREAM_HOLD_AFTER_SUBJECTS": "2", "WEBHOOK_RETRY_LIMIT": "5"}
    )
    await linked(worker, stripe_stub, ["cus_bad", "cus_flaky", *[f"cus_fine_{n}" for n in range(4)]])
    stripe_stub.fail("/v1/customers/cus_bad", status=500, times=None)
    secret = webhook_secrets["stripe"]
    bad = await store(worker, subscription_delivery(secret, "cus_bad"))

    with caplog.at_level(logging.INFO, logger="app.queue.upstreams.calls"):
        assert isinstance(await event_try(worker, bad), SyncComesBack)
        for n in range(4):
            fine = await store(worker, subscription_delivery(secret, f"cus_fine_{n}"))
            assert await event_try(worker, fine) is None
            if n == 1:
                stripe_stub.fail("/v1/customers/cus_flaky", status=503, times=1)
                flaky = await store(worker, subscription_delivery(secret, "cus_flaky"))
                assert isinstance(await event_try(worker, flaky), SyncComesBack)
            else:
                assert isinstance(await comes_back(worker, "customer:cus_bad"), SyncComesBack)
            assert (await STRIPE.of(worker).status()).state == "ok"
    assert await comes_back(worker, "customer:cus_flaky") is None

    assert [r.getMessage() for r in caplog.records if r.name == "app.queue.upstreams.calls"] == []  # no hold

    with caplog.at_level(logging.ERROR, logger="app.webhooks.alerts"):
        await recover(await open_resources(**SHORT_RETRY_WINDOW, MESSAGE_QUEUE_DRIVER="arq"))
    (row,) = await rows_of(worker, [bad])
    assert row.abandoned_at is not None and row.attempts == 4 and "HTTP 500" in (row.last_error or "")
    (alert,) = [r.getMessage() for r in caplog.records if r.name == "app.webhooks.alerts"]
    assert alert.startswith("Webhook event set aside after 4 attempts: provider=stripe")
