"""Phase 9, tracing_cost: what traces cost the intake and a worker, every span exported.

The same API, and the same worker, run twice: with tracing on
(``OTEL_EXPORTER_OTLP_ENDPOINT`` at an OTLP/HTTP endpoint on loopback in the
harness, ``bench/otlp_sink.py``; ``OTEL_TRACES_SAMPLER=always_on``: every
request's and every job's spans, their SQL and Redis included, encoded and
sent), and as shipped, with no endpoint (tracing off: nothing of OpenTelemetry
imported). Intake rounds alternate between the two APIs; Clerk backlogs are
drained by one worker of each kind in turn (``bench/paired.py``). Medians land
in ``Run.results``: the intake's requests per second and the worker's CPU per
Clerk event, each on and off, and their costs ``tracing_intake_cost`` and
``tracing_worker_cost``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from bench.otlp_sink import OtlpSink
from bench.paired import paired_cost, paired_drains, paired_intake, stopped
from bench.processes import Managed

if TYPE_CHECKING:
    from bench.harness import Run


def tracing_env(sink: OtlpSink) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint, "OTEL_TRACES_SAMPLER": "always_on"}


async def tracing_cost(run: Run) -> None:
    with OtlpSink() as sink:
        await _intake(run, sink)
        await _drain(run, sink)
    run.results["tracing_exported_mb"] = sink.bytes / 2**20
    if not sink.exports:
        run.notes.append("tracing cost: the traced processes exported nothing: the figures measure no tracing")


async def _intake(run: Run, sink: OtlpSink) -> None:
    start, factory = run.processes.start_uvicorn, "app.asgi:create_app"
    servers = {
        "on": await asyncio.to_thread(start, "api", "api-tracing-on", factory, {**run.env, **tracing_env(sink)}, 1),
        "off": await asyncio.to_thread(start, "api", "api-tracing-off", factory, run.env, 1),
    }
    measured = await paired_intake(run, "tracing", servers, run.mode.tracing_intake_rounds)
    await stopped(run, servers)
    rps = measured.rps
    run.results.update(
        tracing_intake_rps_on=measured.median("rps", "on"),
        tracing_intake_rps_off=measured.median("rps", "off"),
        tracing_intake_cpu_us_on=measured.median("cpu", "on"),
        tracing_intake_cpu_us_off=measured.median("cpu", "off"),
        tracing_intake_cost=paired_cost(
            run, "tracing cost, intake req/s", [1 - on / off for on, off in zip(rps["on"], rps["off"], strict=True)]
        ),
    )


async def _drain(run: Run, sink: OtlpSink) -> None:
    async def start(kind: str) -> tuple[Managed, str]:
        (worker,) = await run.start_workers(1, tracing_env(sink) if kind == "on" else {})
        return worker, ""

    measured = await paired_drains(run, "tracing", run.mode.tracing_drains, start)
    cpu = measured.cpu
    run.results.update(
        tracing_worker_cpu_ms_on=measured.median("cpu", "on"),
        tracing_worker_cpu_ms_off=measured.median("cpu", "off"),
        tracing_worker_cost=paired_cost(
            run,
            "tracing cost, worker CPU per Clerk event",
            [on / off - 1 for on, off in zip(cpu["on"], cpu["off"], strict=True)],
        ),
    )
