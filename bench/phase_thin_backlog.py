"""Phase thin_backlog: the stripe_backlog phase's drain with Stripe's thin events instead of snapshot ones.

An event destination with thin payloads sends ``v1.customer.subscription.updated``
naming only the subscription (``related_object``). Two backlogs, each drained
as stripe_backlog drains its own (``drain_backlog``: two workers, the budget of
20 calls a second, the stub answering 429 past 25):

- *known*: the stripe_backlog phase's size (10,000 events of 1,000 customers in
  ``--full``), about subscriptions billing has synced before (each workspace
  holds its ``subscription_id``): the intake stores each event under its
  customer, so a customer costs one read, as for snapshot events;
- *unknown*: as many events about the subscriptions of
  ``thin_backlog_unknown_customers`` customers billing never saw (linked
  workspaces, never synced): each subscription is read once for its customer,
  then the customer once: two reads.

Figures: the stub's 429s (both backlogs), Stripe reads per customer of each,
the known drain's time over the time the budget needs for its reads, and the
workers' CPU per event of the known backlog, also as a ratio to the snapshot
backlog's when the stripe_backlog phase ran in the same run. Every workspace
must end as the stub has it.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from app.testing.thin_deliveries import stripe_thin_event
from bench.inbox import Stored, store_events
from bench.phase_stripe_backlog import (
    CHECKED,
    BacklogStripeStub,
    Expected,
    Seeder,
    add_workspaces,
    drain_backlog,
    link_customer,
)

if TYPE_CHECKING:
    from app.testing.stripe_stub import StripeStub
    from bench.harness import Run


async def thin_backlog(run: Run) -> None:
    mode = run.mode
    with BacklogStripeStub() as stub:
        known = await drain_backlog(
            run, stub, mode.stripe_backlog_events, mode.stripe_backlog_customers, _seeder(known=True), "thin backlog"
        )
        unknown = await drain_backlog(
            run,
            stub,
            mode.stripe_backlog_events,
            mode.thin_backlog_unknown_customers,
            _seeder(known=False),
            "thin backlog, customers never seen",
        )
    cpu_ms = known.worker_cpu_seconds / known.events * 1000
    snapshot_cpu_ms = run.results.get("stripe_backlog_worker_cpu_ms")
    run.results.update(
        thin_backlog_429=known.rate_limited + unknown.rate_limited,
        thin_backlog_reads_per_customer=known.calls_per_customer,
        thin_backlog_reads_per_customer_unknown=unknown.calls_per_customer,
        thin_backlog_drain_ratio=known.drain_ratio,
        thin_backlog_drain_ratio_unknown=unknown.drain_ratio,
        thin_backlog_worker_cpu_ms=cpu_ms,
        thin_backlog_cpu_ratio=cpu_ms / snapshot_cpu_ms if snapshot_cpu_ms else None,
        thin_backlog_mismatched=known.mismatched + unknown.mismatched,
        thin_backlog_events=known.events,
        thin_backlog_customers=known.customers,
        thin_backlog_unknown_customers=unknown.customers,
    )


def _seeder(*, known: bool) -> Seeder:
    """Customers with an active subscription in the stub, their workspaces (synced before or never), and a backlog
    of thin events about those subscriptions, interleaved."""

    async def seed(run: Run, stub: StripeStub, events: int, customers: int) -> tuple[Expected, list[Stored]]:
        rng = random.Random(events + customers + known)
        prefix = "cus_thin" if known else "cus_thinnew"
        expected: Expected = {}
        bodies = []
        for n in range(customers):
            customer, seats = f"{prefix}{n:06d}", 2 + rng.randrange(9)
            subscription = str(link_customer(stub, customer, seats)["id"])
            expected[customer] = dict(zip(CHECKED, (subscription, "active", seats, False, seats), strict=True))
            for _ in range(events // customers):
                body = stripe_thin_event("v1.customer.subscription.updated", subscription)
                bodies.append((str(body["id"]), body))
        rng.shuffle(bodies)
        if known:
            await _synced_workspaces(
                run, {customer: str(want["subscription_id"]) for customer, want in expected.items()}
            )
        else:
            await add_workspaces(run, list(expected))
        return expected, await store_events(run, "stripe", bodies)

    return seed


async def _synced_workspaces(run: Run, subscriptions: dict[str, str]) -> None:
    """Workspaces linked to each customer and synced a day ago with its subscription, one seat then (the stub now
    says more, so each must be read again)."""
    await run.pool.executemany(
        "INSERT INTO workspace (stripe_customer_id, subscription_id, subscription_status, seat_quantity, member_limit,"
        " billing_synced_at, name) VALUES ($1, $2, 'active', 1, 3, now() - interval '1 day', $1)",
        list(subscriptions.items()),
    )
