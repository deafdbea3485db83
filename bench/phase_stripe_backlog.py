"""Phase stripe_backlog: a Stripe backlog drained by two workers through the fleet's Stripe API budget.

C linked customers (each a workspace with ``stripe_customer_id`` and an active
subscription in the Stripe stub), E/C ``customer.subscription.updated`` events
each, shuffled as a backlog accumulates, stored in the inbox as the intake
stores them (each with its tenant and sync subject, the customer). Two workers
(``--queues webhook-stripe-queue,stripe-sync-queue``,
``STRIPE_API_RATE_LIMIT_PER_SECOND=20``) are started, then the backlog is
queued to become due at one instant (``bench/backlog.py``) and timed from it
until both queues are empty. The stub (a thread of this process) answers 429
past 25 requests in any second, as Stripe would.

Figures: the stub's 429s (the budget must keep every worker under Stripe's
limit), Stripe calls per distinct customer (a sync covers every event of its
customer that arrived before its read: a burst about one customer costs one
read), the drain time over the time the budget needs for those calls (``calls /
20`` s: how fully the fleet uses the budget; its first second is free, so a
tiny backlog can score under 1), and the workers' CPU per event of the backlog.
Every workspace must end as the stub has it.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil

from app.queue.queues import QueueName
from app.testing.deliveries import stripe_event, stripe_subscription
from app.testing.stripe_stub import StripeStub
from bench.backlog import due_in, queue_events_due, until_due
from bench.inbox import Stored, store_events
from bench.measures import profiler
from bench.phase_drain import one_worker_clerk_drain
from bench.phase_journal import WITHOUT_JOURNAL, stripe_journal_cost
from bench.stripe import BUDGET_PER_SECOND, STUB_LIMIT_PER_SECOND

if TYPE_CHECKING:
    from bench.harness import Run

WORKERS = 2
STRIPE_QUEUES = (str(QueueName.WEBHOOK_STRIPE), str(QueueName.STRIPE_SYNC))
"""What the Stripe backlog's workers serve: the Stripe events' queue and the syncs'."""
CHECKED = ("subscription_id", "subscription_status", "seat_quantity", "cancel_at_period_end", "member_limit")
"""The workspace's columns checked against the stub's state after a drain."""
Expected = dict[str, dict[str, Any]]
Seeder = Callable[["Run", StripeStub, int, int], Awaitable[tuple[Expected, list[Stored]]]]
"""(run, stub, events, customers) -> each customer's expected columns, and the inbox rows (not queued yet)."""


@dataclass
class Drained:
    """One backlog's outcome, as the stub and the database saw it."""

    events: int
    customers: int
    seconds: float
    calls: int
    rate_limited: int
    peak_per_second: int
    worker_cpu_seconds: float
    processed: int = 0
    retried: int = 0
    mismatched: int = 0

    @property
    def calls_per_customer(self) -> float:
        return self.calls / self.customers

    @property
    def drain_ratio(self) -> float:
        """Drain time over the time the budget needs for the calls made: 1.0 is the budget used to the full."""
        return self.seconds / max(self.calls / BUDGET_PER_SECOND, 1e-9)


async def stripe_backlog(run: Run) -> None:
    mode = run.mode
    clerk_cpu_ms = run.results.get("drain_cpu_ms_1w")
    if clerk_cpu_ms is None:  # the drain phase did not run: measured as it measures it
        _, clerk_cpu_ms = await one_worker_clerk_drain(run, "clerk reference", "sr")
    cpu: dict[str, list[float]] = {"on": [], "off": []}
    runs: list[Drained] = []
    # The same backlog drained again and again, by workers with the journal and without its writes, in turn
    # (phase_journal): the first with it gives the phase's own figures.
    for kind in mode.journal_drains:
        launcher = WITHOUT_JOURNAL if kind == "off" else ()
        drained = await drain_backlog(
            run, run.stripe, mode.stripe_backlog_events, mode.stripe_backlog_customers, _seed, launcher=launcher
        )
        cpu[kind].append(drained.worker_cpu_seconds / drained.events * 1000)
        if kind == "on":
            runs.append(drained)
    stripe_journal_cost(run, cpu["on"], cpu["off"])
    main = runs[0]
    cpu_ms = main.worker_cpu_seconds / main.events * 1000
    run.results.update(
        stripe_backlog_429=main.rate_limited,
        stripe_backlog_reads_per_customer=main.calls_per_customer,
        stripe_backlog_drain_ratio=main.drain_ratio,
        stripe_backlog_seconds=main.seconds,
        stripe_backlog_events=main.events,
        stripe_backlog_customers=main.customers,
        stripe_backlog_reads=main.calls,
        stripe_backlog_peak_rps=main.peak_per_second,
        stripe_backlog_mismatched=main.mismatched,
        stripe_backlog_worker_cpu_ms=cpu_ms,
        stripe_backlog_clerk_cpu_ms=clerk_cpu_ms,
        stripe_backlog_cpu_ratio=cpu_ms / clerk_cpu_ms,
    )


async def drain_backlog(
    run: Run,
    stub: StripeStub,
    events: int,
    customers: int,
    seed: Seeder,
    label: str = "stripe backlog",
    launcher: Sequence[str] = (),
) -> Drained:
    """Seed, two workers, queue the backlog due at one instant, time from it until both queues are empty, check;
    releases the workers. ``launcher``: what runs the workers (``bench.without_journal``)."""
    managed = await run.fleet.workers(WORKERS, STRIPE_QUEUES, launcher)
    await run.reset_inbox()
    stub.reset()
    stub.enforce_rate_limit(STUB_LIMIT_PER_SECOND)
    expected, rows = await seed(run, stub, events, customers)
    workers = [psutil.Process(worker.process.pid) for worker in managed]
    due = due_in(len(rows))
    await queue_events_due(run, rows, due)
    await until_due(due, ahead=0.1)
    profile = profiler(run, "worker-stripe-backlog", managed[0], None)
    cpu_before = _cpu_seconds(workers)
    started = await until_due(due)
    ended = await run.wait_queue_empty(max(60.0, 3 * customers / BUDGET_PER_SECOND), STRIPE_QUEUES)
    if profile:
        profile.cancel()
    cpu = _cpu_seconds(workers) - cpu_before
    times = stub.request_times
    drained = Drained(
        events, customers, ended - started, len(times), stub.rate_limited, _most_in_one_second(times), cpu
    )
    stub.enforce_rate_limit(None)  # the phases after run without Stripe's limit
    await run.fleet.release_workers()
    # Where the drain time went: the calls' span against the drain's (a tail after the last call is the worker's
    # own work on events that needed no call).
    last_call = max(times) - started if times else 0.0
    await _check(run, expected, drained, label)
    run.log(
        f"  {label}: {events} events of {customers} customers in {drained.seconds:.1f} s; "
        f"{drained.calls} Stripe calls ({drained.calls_per_customer:.2f} per customer, peak "
        f"{drained.peak_per_second}/s), {drained.rate_limited} answered 429; drain / (calls / "
        f"{BUDGET_PER_SECOND} per s) = {drained.drain_ratio:.2f}; last call {last_call:.1f} s after the instant "
        f"they were due; worker CPU {cpu / events * 1000:.1f} ms per event"
    )
    await run.reset_inbox()
    return drained


async def _seed(run: Run, stub: StripeStub, events: int, customers: int) -> tuple[Expected, list[Stored]]:
    """Workspaces, the stub's customers and subscriptions, and the inbox rows (not queued yet).

    Returns each customer's expected billing columns (the stub's state, which every
    event of the backlog asks to be read: event bodies are never trusted) and the rows.
    """
    rng = random.Random(events + customers)
    expected: dict[str, dict[str, Any]] = {}
    bodies = []
    for n in range(customers):
        customer = f"cus_bench{n:06d}"
        seats = 1 + rng.randrange(9)
        subscription = link_customer(stub, customer, seats)
        expected[customer] = dict(zip(CHECKED, (subscription["id"], "active", seats, False, seats), strict=True))
        for _ in range(events // customers):
            # Bodies as Stripe sent them over time (older seat counts): only the customer id in them matters.
            body = stripe_event(
                "customer.subscription.updated", stripe_subscription(customer, id=subscription["id"], quantity=1)
            )
            bodies.append((body["id"], body))
    rng.shuffle(bodies)  # a backlog accumulates events of every customer, interleaved
    await add_workspaces(run, list(expected))
    return expected, await store_events(run, "stripe", bodies)


def link_customer(stub: StripeStub, customer: str, seats: int) -> dict[str, Any]:
    """A customer in the stub with an active subscription of ``seats`` seats; returns the subscription."""
    stub.put_customer(customer)
    return stub.put_subscription(customer, id=f"sub_{customer.removeprefix('cus_')}", quantity=seats)


async def add_workspaces(run: Run, customers: list[str]) -> None:
    """One workspace linked to each customer (a member limit of 3, the free plan's)."""
    await run.pool.executemany(
        "INSERT INTO workspace (stripe_customer_id, member_limit, name) VALUES ($1, 3, $1)",
        [(customer,) for customer in customers],
    )


async def _check(run: Run, expected: dict[str, dict[str, Any]], drained: Drained, label: str) -> None:
    """Every event processed, and every workspace holding what the stub holds; a note for each shortfall."""
    row = await run.pool.fetchrow(
        "SELECT count(*) FILTER (WHERE processed_at IS NOT NULL) AS done, "
        "count(*) FILTER (WHERE last_error IS NOT NULL OR attempts > 1) AS retried FROM webhook_event"
    )
    drained.processed, drained.retried = int(row["done"]), int(row["retried"])
    columns = ", ".join(CHECKED)
    stored = {
        record["stripe_customer_id"]: {name: record[name] for name in CHECKED}
        for record in await run.pool.fetch(f"SELECT stripe_customer_id, {columns} FROM workspace")
    }
    wrong = [customer for customer, want in expected.items() if stored.get(customer) != want]
    drained.mismatched = len(wrong)
    if drained.processed != drained.events:
        run.notes.append(f"{label}: {drained.processed} of {drained.events} events processed")
    if drained.retried:
        run.notes.append(f"{label}: {drained.retried} events needed more than one attempt")
    if wrong:
        example = wrong[0]
        run.notes.append(
            f"{label}: {len(wrong)} workspaces differ from the Stripe stub, e.g. {example}: "
            f"{stored.get(example)} instead of {expected[example]}"
        )


def _cpu_seconds(processes: list[psutil.Process]) -> float:
    """User + system CPU seconds the processes used so far."""
    return sum(sum(process.cpu_times()[:2]) for process in processes)


def _most_in_one_second(times: list[float]) -> int:
    """The most requests the stub received in any one-second window."""
    ordered, most, start = sorted(times), 0, 0
    for end, at in enumerate(ordered):
        while ordered[start] <= at - 1.0:
            start += 1
        most = max(most, end - start + 1)
    return most
