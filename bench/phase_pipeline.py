"""Phase 2, pipeline: Clerk events at a steady rate through the API and one worker.

The rate is a share (``Mode.pipeline_load``, a half) of the rate at which the
same worker has just drained a backlog of Clerk events, so the load asks the
same of a slow or busy host as of a quiet one. The latency of an event runs
from its 200 to its row's ``processed_at``.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from bench import loadgen
from bench.deliveries import clerk_mix, sign_clerk
from bench.harness import CLERK_QUEUES
from bench.measures import percentile
from bench.phase_drain import one_worker_clerk_drain

if TYPE_CHECKING:
    from bench.harness import Run


async def pipeline(run: Run) -> None:
    mode = run.mode
    api_url = await run.fleet.api()
    await run.fleet.workers(1, CLERK_QUEUES)
    drain_rate, drain_cpu_ms = await one_worker_clerk_drain(run, "clerk pipeline reference", "pr")
    rate = mode.pipeline_load * drain_rate
    total = int(rate * (mode.pipeline_seconds + mode.pipeline_warmup_seconds))
    skip = int(rate * mode.pipeline_warmup_seconds)
    events = clerk_mix(total, "p", seed=11)
    requests = sign_clerk(run.env["CLERK_WEBHOOK_SIGNING_SECRET"], events)
    host, _, port = api_url.removeprefix("http://").partition(":")
    sent = await loadgen.paced(host, int(port), requests, rate=rate)
    answered = {item.event_id: item for item in sent if item.status == 200}
    if len(answered) < total:
        run.notes.append(f"pipeline: {total - len(answered)} of {total} deliveries not answered 200")
    measured = [event.event_id for event in events[skip:] if event.event_id in answered]
    deadline = time.monotonic() + 60
    query = """
        SELECT event_id, extract(epoch FROM processed_at) AS processed FROM webhook_event
        WHERE provider = 'clerk' AND event_id = ANY($1::text[]) AND processed_at IS NOT NULL
    """
    while True:
        rows = await run.pool.fetch(query, measured)
        if len(rows) == len(measured) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    latencies = [(float(row["processed"]) - answered[row["event_id"]].answered_at) * 1000 for row in rows]
    if len(rows) < len(measured):
        # Counted at the time we stopped waiting, a lower bound: leaving them out would flatter the p99.
        done, gave_up = {row["event_id"] for row in rows}, time.time()
        late = [(gave_up - answered[event_id].answered_at) * 1000 for event_id in measured if event_id not in done]
        latencies += late
        run.notes.append(
            f"pipeline: {len(late)} events not processed within 60 s of the last delivery; "
            "counted with the time waited (a lower bound)"
        )
    failed = await run.pool.fetchval("SELECT count(*) FROM webhook_event WHERE last_error IS NOT NULL")
    if failed:
        run.notes.append(f"pipeline: {failed} events failed at least once (see webhook_event.last_error)")
    run.results.update(
        pipeline_p50_ms=percentile(latencies, 0.50),
        pipeline_p99_ms=percentile(latencies, 0.99),
        pipeline_max_ms=max(latencies, default=float("nan")),
        pipeline_events=len(latencies),
        pipeline_intake_p99_ms=percentile([item.latency * 1000 for item in sent], 0.99),
        pipeline_offered_eps=rate,
        pipeline_reference_eps=drain_rate,
        pipeline_reference_cpu_ms=drain_cpu_ms,
    )
    run.log(
        f"  pipeline {len(latencies)} events at {rate:.0f}/s ({mode.pipeline_load:g} x one worker's drain, "
        f"{drain_rate:.0f}/s): p50 {run.results['pipeline_p50_ms']:.1f} ms, p99 {run.results['pipeline_p99_ms']:.1f} ms"
    )
    await run.fleet.release_api()
