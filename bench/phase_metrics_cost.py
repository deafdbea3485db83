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
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import httpx

from bench.paired import Kind, paired_drains, paired_intake, record_intake, record_worker

if TYPE_CHECKING:
    from bench.harness import Run

WITHOUT = ("-m", "bench.without_metrics")
SCRAPE_SECONDS = 1.0


async def metrics_cost(run: Run) -> None:
    await _intake(run)
    await _drain(run)


async def _intake(run: Run) -> None:
    kinds = {"on": Kind(), "off": Kind(WITHOUT)}
    measured = await paired_intake(run, "metrics", kinds, run.mode.metrics_intake_rounds, _scraping_on)
    record_intake(run, "metrics", measured)


async def _drain(run: Run) -> None:
    kinds = {"on": Kind(), "off": Kind(WITHOUT)}
    measured = await paired_drains(run, "metrics", run.mode.metrics_drains, kinds, _scraping_on)
    record_worker(run, "metrics", measured, "metrics_worker_cpu_cost")


def _scraping_on(kind: str, urls: list[str]) -> contextlib.AbstractAsyncContextManager[None]:
    """The kind with metrics is scraped as Prometheus would; the other is not scraped at all."""
    return _scraping(urls if kind == "on" else [])


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
