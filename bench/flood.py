"""A flood of one Clerk organization's membership events, drained with or without other tenants' events
delivered through the API meanwhile: what the isolation and fairness phases measure.

The flood's rows are stored as the intake stores them, then its jobs are
queued at once, asked for now (each placed by its tenant's turn, in pages of
500 as the recovery cron queues them) while the worker polls. The probes (other
tenants' events) are then delivered at a steady rate (open loop) through the API.

- A probe's wait runs from its delivery (the request's scheduled send time) to
  its row's ``processed_at``; the flood events processed in between are the ones
  served before it.
- The flood's drain runs from the start of its queueing to its last event's
  ``processed_at``.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from app.testing.deliveries import clerk_event
from bench import loadgen
from bench.backlog import queue_now
from bench.deliveries import ClerkEvent, sign_clerk
from bench.inbox import store_events
from bench.measures import percentile, profiler

if TYPE_CHECKING:
    from bench.harness import Run

FLOOD_ORG = "org_flood"
MIN_PROBES = 5
PROBE_SHARE = 0.8  # probes are delivered over this share of the flood's time alone: all while it drains
Requests = Sequence[tuple[str, bytes]]  # (event id, HTTP request)


def membership(organization: str, n: int, tag: str) -> tuple[str, dict[str, Any]]:
    """(svix id, body) of an ``organizationMembership.created`` of ``organization``: a new member, its own id."""
    event = clerk_event("organizationMembership.created", id=f"orgmem_{organization}_{tag}{n}")
    event["data"]["organization"] = {**event["data"]["organization"], "id": organization}
    event["data"]["public_user_data"] = {**event["data"]["public_user_data"], "user_id": f"user_{tag}{n:07d}"}
    return f"msg_{organization}_{tag}{n:07d}", event


def signed_memberships(run: Run, events: Sequence[tuple[str, dict[str, Any]]]) -> list[tuple[str, bytes]]:
    """Clerk deliveries of the events, signed now with the run's secret."""
    clerk = [ClerkEvent(event_id, body["type"], json.dumps(body, separators=(",", ":"))) for event_id, body in events]
    return sign_clerk(run.env["CLERK_WEBHOOK_SIGNING_SECRET"], clerk)


def probe_count(rate: float, alone_seconds: float) -> int:
    return max(MIN_PROBES, int(rate * alone_seconds * PROBE_SHARE))


@dataclass
class Flood:
    count: int
    seconds: float
    processed: list[float]  # epoch seconds, sorted

    @property
    def rate(self) -> float:
        return self.count / self.seconds


@dataclass
class Probed:
    waits_ms: list[float] = field(default_factory=list)
    flood_before: list[int] = field(default_factory=list)
    after_flood: int = 0  # delivered once the flood had drained: not measured against it
    unanswered: int = 0
    unprocessed: int = 0

    def p(self, fraction: float) -> float:
        return percentile(self.waits_ms, fraction)


async def drain_flood(
    run: Run, count: int, tag: str, probes: Requests = (), provider: str = "clerk", rate: float = 0.0
) -> tuple[Flood, Probed]:
    """Store the flood, queue it at once, deliver ``probes`` of ``provider`` at ``rate`` while it drains; wait
    for both (the flood within ``count / 10`` s and a minute)."""
    events = [membership(FLOOD_ORG, n, tag) for n in range(count)]
    rows = await store_events(run, "clerk", events)
    profile = profiler(run, f"worker-flood-{tag}", run.fleet.running[0], None)  # --profile: py-spy of the worker
    queued_at = time.time()
    await queue_now(run, rows)
    sending = asyncio.create_task(_deliver(run, probes, rate)) if probes else None
    flood = await _flood_drained(run, count, queued_at, within=60.0 + count / 10)
    if profile:
        profile.cancel()
    probed = Probed()
    if sending is not None:
        probed = await _probed(run, provider, await sending, flood)
    return flood, probed


async def _deliver(run: Run, probes: Requests, rate: float) -> list[loadgen.Sent]:
    host, _, port = (await run.fleet.api()).removeprefix("http://").partition(":")
    return await loadgen.paced(host, int(port), probes, rate=rate, connections=8)


async def _flood_drained(run: Run, count: int, queued_at: float, within: float) -> Flood:
    tenant = f"org:{FLOOD_ORG}"
    deadline = time.monotonic() + within
    pending = "SELECT count(*) FROM webhook_event WHERE processed_at IS NULL AND tenant_key = $1"
    while await run.pool.fetchval(pending, tenant):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the flood of {count} events not processed within {within:.0f} s")
        await asyncio.sleep(0.1)
    rows = await run.pool.fetch(
        "SELECT extract(epoch FROM processed_at)::float8 AS at FROM webhook_event WHERE tenant_key = $1 ORDER BY 1",
        tenant,
    )
    processed = [row["at"] for row in rows]
    if len(processed) != count:
        run.notes.append(f"flood: {len(processed)} rows of {count} events")
    return Flood(count, processed[-1] - queued_at, processed)


async def _probed(run: Run, provider: str, sent: list[loadgen.Sent], flood: Flood) -> Probed:
    """Each answered probe's wait from its delivery to ``processed_at`` (waiting a minute at most)."""
    answered = {item.event_id: item.answered_at - item.latency for item in sent if item.status == 200}
    query = (
        "SELECT event_id, extract(epoch FROM processed_at)::float8 AS at FROM webhook_event "
        "WHERE provider = $1 AND event_id = ANY($2::text[]) AND processed_at IS NOT NULL"
    )
    deadline = time.monotonic() + 60
    while len(rows := await run.pool.fetch(query, provider, list(answered))) < len(answered):
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    probed = Probed(unanswered=len(sent) - len(answered), unprocessed=len(answered) - len(rows))
    # One never processed counts with the time waited for it (a lower bound): leaving it out would flatter the p99.
    gave_up, done = time.time(), {row["event_id"]: row["at"] for row in rows}
    flood_end = flood.processed[-1]
    for event_id, delivered in answered.items():
        at = done.get(event_id, gave_up)
        if delivered >= flood_end:
            probed.after_flood += 1
            continue
        probed.waits_ms.append((at - delivered) * 1000)
        served = bisect.bisect_right(flood.processed, at) - bisect.bisect_right(flood.processed, delivered)
        probed.flood_before.append(served)
    return probed


def note_probes(run: Run, phase: str, probed: Probed) -> None:
    """A note for each probe not measured: refused, never processed, or delivered after the flood drained."""
    for count, what in (
        (probed.unanswered, "deliveries not answered 200"),
        (probed.unprocessed, "events not processed within a minute (counted with the time waited)"),
        (probed.after_flood, "events delivered after the flood drained (not counted)"),
    ):
        if count:
            run.notes.append(f"{phase}: {count} {what}")


def record(run: Run, phase: str, alone: Flood, flood: Flood, probed: Probed) -> None:
    """The phase's figures in ``Run.results`` (keys ``<phase>_...``) and its line in the log."""
    note_probes(run, phase, probed)
    before = probed.flood_before
    share = sum(before) / len(before) / flood.count if before else float("nan")
    run.results.update(
        {
            f"{phase}_probe_p50_ms": probed.p(0.50),
            f"{phase}_probe_p99_ms": probed.p(0.99),
            f"{phase}_probe_max_ms": max(probed.waits_ms, default=float("nan")),
            f"{phase}_probes": len(probed.waits_ms),
            f"{phase}_flood_before_share": share,
            f"{phase}_flood_before_max": max(before, default=0),
            f"{phase}_flood_events": flood.count,
            f"{phase}_flood_eps": flood.rate,
            f"{phase}_flood_alone_eps": alone.rate,
            f"{phase}_flood_drain_ratio": flood.rate / alone.rate,
        }
    )
    run.log(
        f"  {phase}: flood of {flood.count} drained at {flood.rate:.0f}/s ({alone.rate:.0f}/s alone: x"
        f"{flood.rate / alone.rate:.2f}); {len(probed.waits_ms)} other events waited p50 {probed.p(0.5):.0f} ms, "
        f"p99 {probed.p(0.99):.0f} ms; flood events processed before each: mean {share * 100:.2f}% of the flood, "
        f"max {max(before, default=0)}"
    )
