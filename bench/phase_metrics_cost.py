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
from bench.paired import paired_drains, paired_intake, record_intake, record_worker, stopped
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
    record_intake(run, "metrics", measured)


async def _drain(run: Run) -> None:
    async def start(kind: str) -> tuple[Managed, str]:
        port = free_port()
        env = {"WORKER_METRICS_PORT": str(port)} if kind == "on" else {}
        (worker,) = await run.start_workers(1, env, WITHOUT if kind == "off" else ())
        return worker, f"http://127.0.0.1:{port}"

    measured = await paired_drains(run, "metrics", run.mode.metrics_drains, start, _scraping("/metrics"))
    record_worker(run, "metrics", measured, "metrics_worker_cpu_cost")


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
