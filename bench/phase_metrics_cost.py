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
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import httpx

from app.testing.processes import free_port
from bench.paired import paired_cost, paired_drains, paired_intake, stopped
from bench.processes import Managed

if TYPE_CHECKING:
    from bench.harness import Run

WITHOUT = ("-m", "bench.without_metrics")
SCRAPE_SECONDS = 1.0


async def metrics_cost(run: Run) -> None:
    await _intake(run)
    await _drain(run)


async def _intake(run: Run) -> None:
    start = run.processes.start_uvicorn
    servers = {
        "on": await asyncio.to_thread(start, "api", "api-metrics-on", "app.asgi:create_app", run.env, 1),
        "off": await asyncio.to_thread(start, "api", "api-metrics-off", "app.asgi:create_app", run.env, 1, WITHOUT),
    }
    measured = await paired_intake(run, "metrics", servers, run.mode.metrics_intake_rounds, _scraping("/metrics"))
    await stopped(run, servers)
    rps = measured.rps
    run.results.update(
        metrics_intake_rps_on=measured.median("rps", "on"),
        metrics_intake_rps_off=measured.median("rps", "off"),
        metrics_intake_cpu_us_on=measured.median("cpu", "on"),
        metrics_intake_cpu_us_off=measured.median("cpu", "off"),
        metrics_intake_cost=paired_cost(
            run, "metrics cost, intake req/s", [1 - on / off for on, off in zip(rps["on"], rps["off"], strict=True)]
        ),
    )


async def _drain(run: Run) -> None:
    async def start(kind: str) -> tuple[Managed, str]:
        port = free_port()
        env = {"WORKER_METRICS_PORT": str(port)} if kind == "on" else {}
        (worker,) = await run.start_workers(1, env, WITHOUT if kind == "off" else ())
        return worker, f"http://127.0.0.1:{port}"

    measured = await paired_drains(run, "metrics", run.mode.metrics_drains, start, _scraping("/metrics"))
    cpu = measured.cpu
    run.results.update(
        metrics_worker_cpu_ms_on=measured.median("cpu", "on"),
        metrics_worker_cpu_ms_off=measured.median("cpu", "off"),
        # The drains' order pairs them (on, off / off, on / ...): the i-th of each kind make a round.
        metrics_worker_cpu_cost=paired_cost(
            run,
            "metrics cost, worker CPU per job",
            [on / off - 1 for on, off in zip(cpu["on"], cpu["off"], strict=True)],
        ),
    )


def _scraping(path: str) -> Callable[[str, str], contextlib.AbstractAsyncContextManager[None]]:
    """While the kind with metrics is measured, its ``path`` scraped every second, as Prometheus would (the scrapes
    are part of the cost)."""

    @contextlib.asynccontextmanager
    async def scraping(kind: str, base_url: str) -> AsyncIterator[None]:
        async def scrape() -> None:
            logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per scrape in the bench's output
            async with httpx.AsyncClient(timeout=5) as client:
                while True:
                    with contextlib.suppress(httpx.HTTPError):
                        (await client.get(base_url + path)).raise_for_status()
                    await asyncio.sleep(SCRAPE_SECONDS)

        task = asyncio.create_task(scrape()) if kind == "on" else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    return scraping
