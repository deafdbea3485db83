"""Phase isolation: a Clerk flood holds up no Stripe event (each provider's events on a queue of their own).

One worker serving every queue, the run's Stripe stub as Stripe (``STRIPE_API_RATE_LIMIT_PER_SECOND=20``). A
flood of ``isolation_flood`` Clerk membership events of one organization is
queued at once (``bench/flood.py``); then ``customer.subscription.updated``
events of other customers (each linked to a workspace, with a subscription in
the stub: each costs one Stripe read) are delivered through the API at
``isolation_probe_rate`` per second while it drains. A Stripe event is processed
when the sync of its customer has read Stripe and written the workspace.

Figures: the Stripe events' waits (p50, p99) from delivery to ``processed_at``,
and the flood's drain rate against the same flood drained with no other
traffic, just before by the same worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.testing.deliveries import stripe_event, stripe_subscription
from app.testing.stripe_stub import StripeStub
from bench.deliveries import sign_stripe
from bench.flood import drain_flood, probe_count, record
from bench.phase_stripe_backlog import add_workspaces, link_customer

if TYPE_CHECKING:
    from bench.harness import Run

WARM_UP_FLOOD, WARM_UP_PROBES = 100, 5


async def isolation(run: Run) -> None:
    mode, stub = run.mode, run.stripe
    await run.fleet.api()
    await run.fleet.workers(1, queues=None)
    await run.reset_inbox()
    stub.reset()
    # Warm up the worker and the API (connections, prepared statements), then the flood alone, then with Stripe.
    probes = await _probes(run, stub, WARM_UP_PROBES, "w")
    await drain_flood(run, WARM_UP_FLOOD, "iw", probes, "stripe", mode.isolation_probe_rate)
    await run.reset_inbox()
    alone, _ = await drain_flood(run, mode.isolation_flood, "ia")
    await run.reset_inbox()
    probes = await _probes(run, stub, probe_count(mode.isolation_probe_rate, alone.seconds), "p")
    flood, probed = await drain_flood(run, mode.isolation_flood, "ib", probes, "stripe", mode.isolation_probe_rate)
    record(run, "isolation", alone, flood, probed)
    await run.fleet.release_workers()
    await run.fleet.release_api()
    await run.reset_inbox()


async def _probes(run: Run, stub: StripeStub, count: int, tag: str) -> list[tuple[str, bytes]]:
    """A subscription update of each of ``count`` customers, linked to workspaces and in the stub; signed now."""
    customers = [f"cus_{tag}{n:06d}" for n in range(count)]
    for customer in customers:
        link_customer(stub, customer, seats=2)
    await add_workspaces(run, customers)
    events = [
        stripe_event(
            "customer.subscription.updated",
            stripe_subscription(customer, id=f"sub_{customer.removeprefix('cus_')}", quantity=2),
        )
        for customer in customers
    ]
    return sign_stripe(run.env["STRIPE_WEBHOOK_SECRET"], events)
