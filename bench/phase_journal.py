"""What the change journal costs a worker, beside one with its writes skipped (``bench/without_journal.py``).

Part of the drain and stripe_backlog phases. Clerk: backlogs of Clerk events
(users, organizations, memberships: nearly every event writes, so journals,
a row or more) drained by one worker of each kind in turn (on, off, off, on;
the smoke run does one of each); each round's cost is its pair's worker CPU
per event, on over off, and the figure their median. Stripe: the phase's
backlog drained the same way, by two workers of each kind in turn
(``phase_stripe_backlog``). ``journal_worker_cost`` is the larger of the two.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

import psutil

from bench import phase_drain
from bench.backlog import until_due
from bench.phase_drain import clerk_backlog, warm_up

if TYPE_CHECKING:
    from bench.harness import Run

WITHOUT_JOURNAL = ("-m", "bench.without_journal")
DRAIN_EVENTS = 5_000  # per drain, at most: CPU per event does not depend on the backlog's size


async def drain(run: Run) -> None:
    """The drain phase, then the journal's cost on the same Clerk backlogs."""
    await phase_drain.drain(run)
    await clerk_journal_cost(run)


async def clerk_journal_cost(run: Run) -> None:
    count = min(run.mode.drain_events, DRAIN_EVENTS)
    await run.stop_workers()
    cpu: dict[str, list[float]] = {"on": [], "off": []}
    for round_no, kind in enumerate(run.mode.journal_drains):
        (worker,) = await run.start_workers(1, launcher=WITHOUT_JOURNAL if kind == "off" else ())
        await warm_up(run)
        due = await clerk_backlog(run, count, f"j{round_no}")
        await until_due(due, ahead=0.2)
        process = psutil.Process(worker.process.pid)
        before = process.cpu_times()
        started = await until_due(due)
        ended = await run.wait_queue_empty(max(60.0, count / 50))
        after = process.cpu_times()
        cpu[kind].append((after.user + after.system - before.user - before.system) / count * 1000)
        journaled = await run.pool.fetchval("SELECT count(*) FROM workspace_change")
        run.log(
            f"  drain, journal {kind:3s} {count} Clerk events in {ended - started:6.2f} s: "
            f"{cpu[kind][-1]:5.2f} worker CPU ms/event, {journaled} journal rows"
        )
        if (kind == "on") != (journaled > 0):
            run.notes.append(f"journal {kind}: {journaled} journal rows after {count} Clerk events")
        await run.stop_workers()
        await run.reset_inbox()
    _record(run, "clerk", cpu["on"], cpu["off"])


def stripe_journal_cost(run: Run, on_cpu_ms: list[float], off_cpu_ms: list[float]) -> None:
    """The Stripe backlog's worker CPU per event, with the journal and without, in the order they were drained."""
    _record(run, "stripe", on_cpu_ms, off_cpu_ms)


def _record(run: Run, kind: str, on: list[float], off: list[float]) -> None:
    """The medians, and the cost: the median of each round's pair (the i-th of each kind), so a slow moment of a
    shared host spoils one round, not one kind."""
    costs = [with_it / without - 1 for with_it, without in zip(on, off, strict=True)]
    if len(costs) > 1:
        each = ", ".join(f"{cost:.1%}" for cost in costs)
        run.notes.append(f"journal cost, {kind} worker CPU per event, each round: {each}")
    run.results.update(
        {
            f"journal_{kind}_cpu_ms_on": statistics.median(on),
            f"journal_{kind}_cpu_ms_off": statistics.median(off),
            f"journal_worker_cost_{kind}": statistics.median(costs),
        }
    )
    _overall(run)


def _overall(run: Run) -> None:
    costs = [
        run.results[key] for key in ("journal_worker_cost_clerk", "journal_worker_cost_stripe") if key in run.results
    ]
    run.results["journal_worker_cost"] = max(costs)
