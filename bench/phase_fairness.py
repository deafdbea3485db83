"""Phase fairness: one organization's flood holds up no other organization's events (start-time fair queuing).

One worker (the Clerk events' queue). A flood of ``fairness_flood`` membership
events of one organization is queued at once (``bench/flood.py``); then
membership events of ``fairness_orgs`` other organizations, in turn, are
delivered through the API at ``fairness_probe_rate`` per second while it drains.

Figures: the other organizations' waits (p50, p99) from delivery to
``processed_at``; how many flood events were processed between each one's
delivery and its processing (the mean, as a share of the flood); the flood's
drain rate against the same flood drained with no other traffic, just before
by the same worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bench.flood import drain_flood, membership, probe_count, record, signed_memberships
from bench.harness import CLERK_QUEUES

if TYPE_CHECKING:
    from bench.harness import Run

WARM_UP_FLOOD, WARM_UP_PROBES = 100, 5


async def fairness(run: Run) -> None:
    mode = run.mode
    await run.fleet.api()
    await run.fleet.workers(1, CLERK_QUEUES)
    await run.reset_inbox()
    # Warm up the worker and the API (connections, prepared statements), then the flood alone, then with the others.
    await drain_flood(run, WARM_UP_FLOOD, "fw", _probes(run, WARM_UP_PROBES, WARM_UP_PROBES, "fw"), "clerk", 10.0)
    await run.reset_inbox()
    alone, _ = await drain_flood(run, mode.fairness_flood, "fa")
    await run.reset_inbox()
    probes = _probes(run, probe_count(mode.fairness_probe_rate, alone.seconds), mode.fairness_orgs, "fp")
    flood, probed = await drain_flood(run, mode.fairness_flood, "fb", probes, "clerk", mode.fairness_probe_rate)
    record(run, "fairness", alone, flood, probed)
    run.results["fairness_orgs"] = min(mode.fairness_orgs, len(probes))
    await run.fleet.release_workers()
    await run.fleet.release_api()
    await run.reset_inbox()


def _probes(run: Run, count: int, organizations: int, tag: str) -> list[tuple[str, bytes]]:
    """``count`` membership events of ``organizations`` other organizations in turn, signed now."""
    events = [membership(f"org_other{n % organizations:03d}", n, tag) for n in range(count)]
    return signed_memberships(run, events)
