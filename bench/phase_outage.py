"""Phase outage: Stripe down for everyone, several times longer than the whole retry window, then answering again.

E ``customer.subscription.updated`` events of C linked customers arrive (due at
one instant, as in ``stripe_backlog``) while the Stripe stub answers 500 to
every call. The retry window is shrunk as the soak shrinks it: 3 tries a round
from 0.2 s, and the recovery cron (every minute, here) re-queues what is 5 s
old and sets aside an event at its 3rd attempt, so without the hold every event
would be set aside within the outage's first minutes. The hold's own settings
are the defaults (``UPSTREAM_HOLD_AFTER_SUBJECTS=3``,
``UPSTREAM_PROBE_SECONDS=30``; the smoke run probes every 3 s). Two workers
serve every queue (the crons run); the other crons never tick.

After the outage the stub answers again; the next probe ends the hold, and the
backlog drains. Figures: Stripe calls made during the outage (goal: at most
outage / probe interval + hold threshold + 2), events set aside (goal 0), the
workers' CPU during the outage as a share of one core (goal <= 5%), and the
drain from the probe's success to the last event processed over the time the
budget needs for the reads made (goal <= 1.25). Every workspace must end as the
stub has it.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psutil

from app.billing.budget import STRIPE
from app.queue.queues import QueueName
from app.testing.deliveries import stripe_event, stripe_subscription
from bench.backlog import due_in, queue_events_due, until_due
from bench.fleet import KEPT_QUEUES
from bench.inbox import Stored, store_events
from bench.phase_stripe_backlog import add_workspaces, link_customer
from bench.stripe import BUDGET_PER_SECOND, BacklogStripeStub

if TYPE_CHECKING:
    from bench.harness import Run

HOLD_AFTER_SUBJECTS = 3
IDLE_SECONDS = 15.0
"""How long the idle workers' CPU is measured (quick; scaled with the outage)."""
NEVER_RUNS = "0 0 29 2 *"
SHRUNK_RETRY_WINDOW = {
    "WEBHOOK_RETRY_LIMIT": "2",
    "WEBHOOK_RETRY_BASE_SECONDS": "0.2",
    "WEBHOOK_ABANDON_AFTER_ATTEMPTS": "3",
    "WEBHOOK_RECOVERY_AFTER_SECONDS": "5",
    "WEBHOOK_RECOVERY_CRON": "* * * * *",
    "WEBHOOK_BACKFILL_CRON": NEVER_RUNS,
    "BILLING_RECONCILE_CRON": NEVER_RUNS,
    "IDENTITY_RECONCILE_CRON": NEVER_RUNS,
    "WEBHOOK_RETENTION_CRON": NEVER_RUNS,
}


@dataclass
class Outage:
    seconds: float
    probe_seconds: float
    calls: int = 0
    set_aside: int = 0
    idle_cpu_share: float = 0.0
    """The two workers' CPU, as a share of one core, idle (polling their queues) before the events arrive."""
    arrival_seconds: float = 0.0
    arrival_cpu_seconds: float = 0.0
    held_cpu_seconds: float = 0.0
    """The workers' CPU from the arrivals taken in (every event asked for its sync, each sync told to wait) to
    the end of the outage: waiting syncs, probes, recovery ticks."""
    held_after: float | None = None
    drain_seconds: float = 0.0
    drain_reads: int = 0
    processed: int = 0
    mismatched: int = 0

    @property
    def calls_goal(self) -> int:
        return int(self.seconds / self.probe_seconds) + HOLD_AFTER_SUBJECTS + 2

    @property
    def held_cpu_share(self) -> float:
        """Share of a core the workers used while everything waited, beyond their idle share."""
        return max(self.held_cpu_seconds / (self.seconds - self.arrival_seconds) - self.idle_cpu_share, 0.0)

    @property
    def drain_ratio(self) -> float:
        return self.drain_seconds / max(self.drain_reads / BUDGET_PER_SECOND, 1e-9)


async def outage(run: Run) -> None:
    mode = run.mode
    result = await _outage(run, run.stripe, mode.outage_events, mode.outage_customers, mode.outage_seconds)
    run.results.update(
        outage_calls=result.calls,
        outage_calls_goal=result.calls_goal,
        outage_set_aside=result.set_aside,
        outage_worker_cpu_share=result.held_cpu_share,
        outage_idle_cpu_share=result.idle_cpu_share,
        outage_arrival_cpu_seconds=result.arrival_cpu_seconds,
        outage_arrival_seconds=result.arrival_seconds,
        outage_drain_ratio=result.drain_ratio,
        outage_seconds=result.seconds,
        outage_probe_seconds=result.probe_seconds,
        outage_held_after_seconds=result.held_after,
        outage_drain_seconds=result.drain_seconds,
        outage_drain_reads=result.drain_reads,
        outage_events=mode.outage_events,
        outage_mismatched=result.mismatched,
    )


async def _outage(run: Run, stub: BacklogStripeStub, events: int, customers: int, seconds: float) -> Outage:
    await run.reset_inbox()
    stub.reset()
    result = Outage(seconds, run.mode.outage_probe_seconds)
    env = {"UPSTREAM_PROBE_SECONDS": str(result.probe_seconds), **SHRUNK_RETRY_WINDOW}
    # Workers of their own (the shrunk retries), serving the crons too: the recovery cron re-queues what waits.
    managed = await run.fleet.workers(2, (*KEPT_QUEUES, str(QueueName.CRON)), env=env)
    stub.fail("/v1", status=500, times=None)
    workers = [psutil.Process(worker.process.pid) for worker in managed]
    result.idle_cpu_share = await _idle_share(workers, IDLE_SECONDS * (seconds / 180.0))
    # Stored only now: the recovery cron (every minute) queues what is 5 s old, the outage's events included.
    expected, rows = await _seed(run, stub, events, customers)
    due = due_in(len(rows))
    await queue_events_due(run, rows, due)
    started = await until_due(due)
    cpu_before = _cpu_seconds(workers)
    taken_in = await _arrivals_taken_in(run, started, customers)
    cpu_taken_in = _cpu_seconds(workers)
    result.arrival_cpu_seconds, result.arrival_seconds = cpu_taken_in - cpu_before, taken_in - started
    result.held_after = await _while_down(run, started, seconds, due.at)
    result.held_cpu_seconds = _cpu_seconds(workers) - cpu_taken_in
    result.calls = len(stub.request_times)
    result.set_aside = await _set_aside(run)
    stub.clear_faults()  # Stripe answers again
    answered = await _hold_ended(run, within=result.probe_seconds + 30)
    reads_before = len(stub.request_times)
    done = await _all_processed(run, events, within=60 + 3 * customers / BUDGET_PER_SECOND)
    result.drain_seconds, result.drain_reads = done - answered, len(stub.request_times) - reads_before + 1
    result.set_aside = max(result.set_aside, await _set_aside(run))
    result.processed, result.mismatched = await _check(run, expected)
    await run.fleet.release_workers()
    _log(run, result, events, customers)
    await run.reset_inbox()
    return result


async def _seed(run: Run, stub: BacklogStripeStub, events: int, customers: int) -> tuple[dict[str, int], list[Stored]]:
    """Customers with an active subscription each (their seats, expected at the end), their workspaces, and the
    events (stored, not queued)."""
    rng = random.Random(events + customers)
    expected: dict[str, int] = {}
    bodies = []
    for n in range(customers):
        customer = f"cus_outage{n:06d}"
        seats = 1 + rng.randrange(9)
        subscription = link_customer(stub, customer, seats)
        expected[customer] = seats
        for _ in range(events // customers):
            body = stripe_event(
                "customer.subscription.updated", stripe_subscription(customer, id=subscription["id"], quantity=1)
            )
            bodies.append((body["id"], body))
    rng.shuffle(bodies)
    await add_workspaces(run, list(expected))
    return expected, await store_events(run, "stripe", bodies)


async def _idle_share(workers: list[psutil.Process], seconds: float) -> float:
    before = _cpu_seconds(workers)
    await asyncio.sleep(seconds)
    return (_cpu_seconds(workers) - before) / seconds


async def _arrivals_taken_in(run: Run, started: float, customers: int) -> float:
    """When every event asked for its sync (the Stripe events' queue is empty) and every sync had its reservation (one
    customer's read each at the budget's pace), a second's margin after (``perf_counter``)."""
    await run.wait_queue_empty(60 + customers, (str(QueueName.WEBHOOK_STRIPE),))
    await asyncio.sleep(max(0.0, started + customers / BUDGET_PER_SECOND + 1.0 - time.perf_counter()))
    return time.perf_counter()


async def _while_down(run: Run, started: float, seconds: float, due_at: float) -> float | None:
    """Sleep through the outage; when the hold began, in seconds after the events were due (None: not held)."""
    await asyncio.sleep(max(0.0, started + seconds - time.perf_counter()))
    status = await STRIPE.of(run.resources).status()
    return status.since.timestamp() - due_at if status.state == "held" and status.since else None


async def _hold_ended(run: Run, within: float) -> float:
    """When the probe's success ended the hold (``perf_counter``)."""
    calls, deadline = STRIPE.of(run.resources), time.perf_counter() + within
    while (await calls.status()).state != "ok":
        if time.perf_counter() > deadline:
            raise TimeoutError(f"the stripe upstream was still held {within:g} s after Stripe answered again")
        await asyncio.sleep(0.02)
    return time.perf_counter()


async def _all_processed(run: Run, events: int, within: float) -> float:
    deadline = time.perf_counter() + within
    while await run.pool.fetchval("SELECT count(*) FROM webhook_event WHERE processed_at IS NOT NULL") < events:
        if time.perf_counter() > deadline:
            raise TimeoutError(f"the backlog was not processed within {within:g} s of the hold's end")
        await asyncio.sleep(0.02)
    return time.perf_counter()


async def _set_aside(run: Run) -> int:
    return int(await run.pool.fetchval("SELECT count(*) FROM webhook_event WHERE abandoned_at IS NOT NULL"))


async def _check(run: Run, expected: dict[str, int]) -> tuple[int, int]:
    """Events processed, and workspaces whose seats differ from the stub's."""
    processed = int(await run.pool.fetchval("SELECT count(*) FROM webhook_event WHERE processed_at IS NOT NULL"))
    stored = dict(await run.pool.fetch("SELECT stripe_customer_id, seat_quantity FROM workspace"))
    wrong = [customer for customer, seats in expected.items() if stored.get(customer) != seats]
    if wrong:
        run.notes.append(f"outage: {len(wrong)} workspaces differ from the Stripe stub, e.g. {wrong[0]}")
    return processed, len(wrong)


def _cpu_seconds(processes: list[psutil.Process]) -> float:
    return sum(sum(process.cpu_times()[:2]) for process in processes)


def _log(run: Run, result: Outage, events: int, customers: int) -> None:
    held = "never" if result.held_after is None else f"{result.held_after:.1f} s"
    run.log(
        f"  outage: {events} events of {customers} customers, Stripe down {result.seconds:.0f} s (probe every "
        f"{result.probe_seconds:g} s): held after {held}; {result.calls} Stripe calls during it (goal <= "
        f"{result.calls_goal}); {result.set_aside} set aside; the arrivals took {result.arrival_cpu_seconds:.1f} s "
        f"of CPU in {result.arrival_seconds:.0f} s, then the workers used {result.held_cpu_share * 100:.1f}% of a "
        f"core beyond their idle {result.idle_cpu_share * 100:.1f}%; "
        f"drained {result.drain_reads} reads in {result.drain_seconds:.1f} s after the probe's success "
        f"({result.drain_ratio:.2f} x reads / {BUDGET_PER_SECOND} per s); {result.processed} processed"
    )
