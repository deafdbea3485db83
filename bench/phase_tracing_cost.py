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
``tracing_worker_cost``. The same again at the sampling most deployments
use (``Mode.tracing_sampled_ratio``, a tenth of the deliveries traced):
``tracing_sampled_intake_cost`` and ``tracing_sampled_worker_cost``.

With ``--baseline-tree DIR`` (a checkout of the product before tracing), the
product with tracing off is measured the same way against that one:
``tracing_off_intake_cost`` and ``tracing_off_worker_cost``, what tracing
costs a deployment that does not use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bench.otlp_sink import OtlpSink
from bench.paired import Kind, paired_drains, paired_intake, record_intake, record_worker

if TYPE_CHECKING:
    from bench.harness import Run


def tracing_env(sink: OtlpSink, ratio: float | None = None) -> dict[str, str]:
    """Every span (``ratio`` None), or the traces of that share of the deliveries (the usual production set-up)."""
    if ratio is None:
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint, "OTEL_TRACES_SAMPLER": "always_on"}
    sampler = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": str(ratio)}
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint, **sampler}


async def tracing_cost(run: Run) -> None:
    with OtlpSink() as sink:
        kinds = {"on": Kind(env=tracing_env(sink)), "off": Kind()}
        record_intake(run, "tracing", await paired_intake(run, "tracing", kinds, run.mode.tracing_intake_rounds))
        drains = await paired_drains(run, "tracing", run.mode.tracing_drains, kinds)
        record_worker(run, "tracing", drains, "tracing_worker_cost")
        run.results["tracing_exported_mb"] = sink.bytes / 2**20
        if (ratio := run.mode.tracing_sampled_ratio) is not None:
            sampled = {"on": Kind(env=tracing_env(sink, ratio)), "off": Kind()}
            rounds = run.mode.tracing_intake_rounds
            record_intake(run, "tracing_sampled", await paired_intake(run, "sampled", sampled, rounds))
            drains = await paired_drains(run, "sampled", run.mode.tracing_drains, sampled)
            record_worker(run, "tracing_sampled", drains, "tracing_sampled_worker_cost")
    if run.baseline_tree:
        before = {"on": Kind(), "off": Kind(launcher=("-m", "bench.from_tree", run.baseline_tree))}
        record_intake(run, "tracing_off", await paired_intake(run, "before", before, run.mode.tracing_intake_rounds))
        drains = await paired_drains(run, "before", run.mode.tracing_drains, before)
        record_worker(run, "tracing_off", drains, "tracing_off_worker_cost")
    if not sink.exports:
        run.notes.append("tracing cost: the traced processes exported nothing: the figures measure no tracing")
