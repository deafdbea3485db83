"""Phase 6, metrics_cost: what the metrics cost the intake and a worker.

The same API, and the same worker, run twice: as shipped (every delivery,
job and event counted, ``/metrics`` scraped every second as Prometheus
would), and with every count a no-op (``bench/without_metrics.py``). Intake
rounds alternate between the two APIs at the intake phase's concurrency;
Clerk backlogs are drained by one worker of each kind in turn (on, off, off,
on, on, off; the smoke run does one round of each). Medians land in
``Run.results``: the intake's requests per second and the worker's CPU per
job, each with and without.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import statistics
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import httpx
import psutil

from bench import loadgen
from bench.backlog import until_due
from bench.deliveries import stripe_set
from bench.harness import CLERK_QUEUES
from bench.measures import cpu_seconds, profiler
from bench.phase_drain import clerk_backlog, warm_up

if TYPE_CHECKING:
    from bench.harness import Run

WITHOUT = ("-m", "bench.without_metrics")
SCRAPE_SECONDS = 1.0
DRAIN_EVENTS = 5_000  # per drain, at most: CPU per job does not depend on the backlog's size


async def metrics_cost(run: Run) -> None:
    await _intake(run)
    await _drain(run)


def paired_cost(run: Run, what: str, costs: list[float]) -> float:
    """The median of the rounds' costs (a round: one run of each kind side by side); each round's in the notes."""
    if len(costs) > 1:
        run.notes.append(f"metrics cost, {what}, each round: " + ", ".join(f"{cost * 100:.1f}%" for cost in costs))
    return statistics.median(costs)


async def _intake(run: Run) -> None:
    mode = run.mode
    urls = dict(zip(("on", "off"), await asyncio.gather(run.fleet.api(), run.fleet.api(WITHOUT)), strict=True))
    rps: dict[str, list[float]] = {"on": [], "off": []}
    cpu: dict[str, list[float]] = {"on": [], "off": []}
    for kind in urls:  # unrecorded: a fresh API's first requests (connections, first imports) would count
        await _load(run, kind, urls[kind], max(mode.intake_warmup_seconds, 0.5), "warm")
    for round_no in range(mode.metrics_intake_rounds):
        order = ["on", "off"] if round_no % 2 == 0 else ["off", "on"]
        for kind in order:
            requests_per_second, cpu_us = await _load(run, kind, urls[kind], mode.intake_seconds, f"{round_no:02d}")
            rps[kind].append(requests_per_second)
            cpu[kind].append(cpu_us)
            run.log(
                f"  intake, metrics {kind:3s} {requests_per_second:8.0f} req/s  server CPU {cpu_us:5.0f} us/request"
            )
        await run.reset_inbox()
    await run.fleet.release_api()
    run.results.update(
        metrics_intake_rps_on=statistics.median(rps["on"]),
        metrics_intake_rps_off=statistics.median(rps["off"]),
        metrics_intake_cpu_us_on=statistics.median(cpu["on"]),
        metrics_intake_cpu_us_off=statistics.median(cpu["off"]),
        metrics_intake_cost=paired_cost(
            run,
            "intake req/s",
            [1 - on / off if off else math.nan for on, off in zip(rps["on"], rps["off"], strict=True)],
        ),
    )


async def _load(run: Run, kind: str, url: str, seconds: float, tag: str) -> tuple[float, float]:
    """Stripe deliveries at the intake phase's concurrency for ``seconds``: req/s, and the server's CPU per request."""
    cap = 12_000 if run.use_wrk and loadgen.wrk_path() else 6_000
    signed = stripe_set(run.env["STRIPE_WEBHOOK_SECRET"], int(seconds * cap) + 1000, f"m{kind}{tag}")
    lines, template = signed.write(run.directory, f"metrics-{kind}-{tag}")
    server = run.fleet.api_process(WITHOUT if kind == "off" else ())
    cpu_before = cpu_seconds(server)
    async with _scraping([f"{url}/metrics"] if kind == "on" else []):
        result = await loadgen.run_closed_loop(
            url, lines, template, seconds=seconds, connections=run.mode.connections, use_wrk=run.use_wrk
        )
    lines.unlink()
    return result.rps, (cpu_seconds(server) - cpu_before) / max(1, result.requests) * 1e6


async def _drain(run: Run) -> None:
    count = min(run.mode.drain_events, DRAIN_EVENTS)
    cpu: dict[str, list[float]] = {"on": [], "off": []}
    for round_no, kind in enumerate(run.mode.metrics_drains):
        workers = await run.fleet.workers(1, CLERK_QUEUES, WITHOUT if kind == "off" else ())
        await warm_up(run)
        due = await clerk_backlog(run, count, f"m{round_no}")
        await until_due(due, ahead=0.2)
        processes = [psutil.Process(worker.process.pid) for worker in workers]
        profile = profiler(run, f"worker-metrics-{kind}-{round_no}", workers[0], None)
        before = sum(sum(process.cpu_times()[:2]) for process in processes)
        async with _scraping([str(worker.metrics_url) for worker in workers] if kind == "on" else []):
            started = await until_due(due)
            ended = await run.wait_queue_empty(max(60.0, count / 50))
        used = sum(sum(process.cpu_times()[:2]) for process in processes) - before
        if profile:
            profile.cancel()
        cpu[kind].append(used / count * 1000)
        run.log(
            f"  drain, metrics {kind:3s} {count} jobs in {ended - started:6.2f} s: "
            f"{cpu[kind][-1]:5.2f} worker CPU ms/job"
        )
        await run.fleet.release_workers()  # each round's worker a new one
        await run.reset_inbox()
    run.results.update(
        metrics_worker_cpu_ms_on=statistics.median(cpu["on"]),
        metrics_worker_cpu_ms_off=statistics.median(cpu["off"]),
        # The drains' order pairs them (on, off / off, on / ...): the i-th of each kind make a round.
        metrics_worker_cpu_cost=paired_cost(
            run, "worker CPU per job", [on / off - 1 for on, off in zip(cpu["on"], cpu["off"], strict=True)]
        ),
    )


@contextlib.asynccontextmanager
async def _scraping(urls: list[str]) -> AsyncIterator[None]:
    """Scrape each URL every second while the block runs, as Prometheus would (the scrapes are part of the cost)."""

    async def scrape() -> None:
        logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per scrape in the bench's output
        async with httpx.AsyncClient(timeout=5) as client:
            while True:
                for url in urls:
                    with contextlib.suppress(httpx.HTTPError):
                        (await client.get(url)).raise_for_status()
                await asyncio.sleep(SCRAPE_SECONDS)

    task = asyncio.create_task(scrape()) if urls else None
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
