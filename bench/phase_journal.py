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

import contextlib
import statistics
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from bench import phase_drain
from bench.paired import Kind, paired_cost, paired_drains

if TYPE_CHECKING:
    from bench.harness import Run

WITHOUT_JOURNAL = ("-m", "bench.without_journal")


async def drain(run: Run) -> None:
    """The drain phase, then the journal's cost on the same Clerk backlogs."""
    await phase_drain.drain(run)
    await clerk_journal_cost(run)


async def clerk_journal_cost(run: Run) -> None:
    @contextlib.asynccontextmanager
    async def checked(kind: str, _: list[str]) -> AsyncIterator[None]:
        yield  # the backlog drained: a worker with the journal wrote its rows, one without it none
        journaled = await run.pool.fetchval("SELECT count(*) FROM workspace_change")
        if (kind == "on") != (journaled > 0):
            run.notes.append(f"journal {kind}: {journaled} journal rows after a drain of Clerk events")

    kinds = {"on": Kind(), "off": Kind(WITHOUT_JOURNAL)}
    measured = await paired_drains(run, "journal", run.mode.journal_drains, kinds, checked)
    _record(run, "clerk", measured.cpu["on"], measured.cpu["off"])


def stripe_journal_cost(run: Run, on_cpu_ms: list[float], off_cpu_ms: list[float]) -> None:
    """The Stripe backlog's worker CPU per event, with the journal and without, in the order they were drained."""
    _record(run, "stripe", on_cpu_ms, off_cpu_ms)


def _record(run: Run, kind: str, on: list[float], off: list[float]) -> None:
    """The medians, and the cost: the median of each round's pair (the i-th of each kind), so a slow moment of a
    shared host spoils one round, not one kind."""
    costs = [with_it / without - 1 for with_it, without in zip(on, off, strict=True)]
    run.results.update(
        {
            f"journal_{kind}_cpu_ms_on": statistics.median(on),
            f"journal_{kind}_cpu_ms_off": statistics.median(off),
            f"journal_worker_cost_{kind}": paired_cost(run, f"journal cost, {kind} worker CPU per event", costs),
        }
    )
    costs_so_far = [
        run.results[key] for key in ("journal_worker_cost_clerk", "journal_worker_cost_stripe") if key in run.results
    ]
    run.results["journal_worker_cost"] = max(costs_so_far)
