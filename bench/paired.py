"""Two kinds of the same process measured side by side: the intake's req/s, a worker's CPU per Clerk event.

What a feature costs (the metrics, the traces) is measured by running the
product with it and without it in the same run, in alternating order, so a
slow moment of a shared machine spoils one round, not one kind. Each round
(one run of each kind) gives a cost; the median of those is the figure. A kind
is the run's fleet asked for a process started another way (``Kind``: a
launcher such as ``bench.without_metrics``, or settings such as an OTLP
endpoint).
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psutil

from bench import loadgen
from bench.backlog import until_due
from bench.deliveries import stripe_set
from bench.harness import CLERK_QUEUES
from bench.measures import cpu_seconds, profiler
from bench.phase_drain import clerk_backlog, warm_up

if TYPE_CHECKING:
    from bench.harness import Run

DRAIN_EVENTS = 5_000  # per drain, at most: CPU per job does not depend on the backlog's size
During = Callable[[str, list[str]], contextlib.AbstractAsyncContextManager[None]]
"""What runs beside each measurement (a scraper of the /metrics of the kind with metrics), given the kind and the
URLs of its processes' /metrics."""


@dataclass(frozen=True)
class Kind:
    """How the fleet starts one kind of process: ``python -m`` arguments run first, settings over the run's."""

    launcher: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


@contextlib.asynccontextmanager
async def _nothing(_: str, __: list[str]) -> AsyncIterator[None]:
    yield


@dataclass
class Paired:
    """Each kind's figures, in the order measured."""

    rps: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)

    def add(self, kind: str, rps: float | None, cpu: float) -> None:
        if rps is not None:
            self.rps.setdefault(kind, []).append(rps)
        self.cpu.setdefault(kind, []).append(cpu)

    def median(self, figure: str, kind: str) -> float:
        return statistics.median((self.rps if figure == "rps" else self.cpu)[kind])


def paired_cost(run: Run, what: str, costs: list[float]) -> float:
    """The median of the rounds' costs (a round: one run of each kind side by side); each round's in the notes."""
    if len(costs) > 1:
        run.notes.append(f"{what}, each round: " + ", ".join(f"{cost * 100:.1f}%" for cost in costs))
    return statistics.median(costs)


def record_intake(run: Run, feature: str, measured: Paired) -> None:
    """``<feature>_intake_rps_on/off``, ``..._cpu_us_on/off`` and ``<feature>_intake_cost`` (1 - req/s on / off)."""
    rps = measured.rps
    costs = [1 - on / off if off else math.nan for on, off in zip(rps["on"], rps["off"], strict=True)]
    run.results.update(
        {
            **{f"{feature}_intake_rps_{kind}": measured.median("rps", kind) for kind in ("on", "off")},
            **{f"{feature}_intake_cpu_us_{kind}": measured.median("cpu", kind) for kind in ("on", "off")},
            f"{feature}_intake_cost": paired_cost(run, f"{feature} cost, intake req/s", costs),
        }
    )


def record_worker(run: Run, feature: str, measured: Paired, cost_key: str) -> None:
    """``<feature>_worker_cpu_ms_on/off`` and ``cost_key`` (CPU per job on / off - 1).

    The drains' order pairs them (on, off / off, on / ...): the i-th of each kind make a round.
    """
    cpu = measured.cpu
    costs = [on / off - 1 for on, off in zip(cpu["on"], cpu["off"], strict=True)]
    run.results.update(
        {
            **{f"{feature}_worker_cpu_ms_{kind}": measured.median("cpu", kind) for kind in ("on", "off")},
            cost_key: paired_cost(run, f"{feature} cost, worker CPU per job", costs),
        }
    )


async def paired_intake(
    run: Run, label: str, kinds: Mapping[str, Kind], rounds: int, during: During = _nothing
) -> Paired:
    """``rounds`` rounds of Stripe intake against each kind's API, in turn (the first kind first, then reversed)."""
    urls = {name: await run.fleet.api(kind.launcher, kind.env) for name, kind in kinds.items()}
    for name in kinds:  # unrecorded: a fresh API's first requests (connections, first imports) would count
        await _load(run, label, name, kinds[name], urls[name], max(run.mode.intake_warmup_seconds, 0.5), "warm")
    measured, names = Paired(), list(kinds)
    for round_no in range(rounds):
        for name in names if round_no % 2 == 0 else names[::-1]:
            async with during(name, [f"{urls[name]}/metrics"]):
                rps, cpu_us = await _load(
                    run, label, name, kinds[name], urls[name], run.mode.intake_seconds, f"{round_no:02d}"
                )
            measured.add(name, rps, cpu_us)
            run.log(f"  intake, {label} {name:3s} {rps:8.0f} req/s  server CPU {cpu_us:5.0f} us/request")
        await run.reset_inbox()
    await run.fleet.release_api()
    return measured


async def _load(run: Run, label: str, name: str, kind: Kind, url: str, seconds: float, tag: str) -> tuple[float, float]:
    """Stripe deliveries at the intake phase's concurrency for ``seconds``: req/s, and the server's CPU per request."""
    cap = 12_000 if run.use_wrk and loadgen.wrk_path() else 6_000
    signed = stripe_set(run.env["STRIPE_WEBHOOK_SECRET"], int(seconds * cap) + 1000, f"{label[0]}{name}{tag}")
    lines, template = signed.write(run.directory, f"{label}-{name}-{tag}")
    server = run.fleet.api_process(kind.launcher, kind.env)
    profile = profiler(run, f"api-{label}-{name}-{tag}", server, seconds) if tag != "warm" else None
    cpu_before = cpu_seconds(server)
    result = await loadgen.run_closed_loop(
        url, lines, template, seconds=seconds, connections=run.mode.connections, use_wrk=run.use_wrk
    )
    if profile:
        await profile
    lines.unlink()
    return result.rps, (cpu_seconds(server) - cpu_before) / max(1, result.requests) * 1e6


async def paired_drains(
    run: Run, label: str, order: Sequence[str], kinds: Mapping[str, Kind], during: During = _nothing
) -> Paired:
    """A Clerk backlog drained by a fresh worker of each kind of ``order`` in turn; its CPU ms per event."""
    count = min(run.mode.drain_events, DRAIN_EVENTS)
    measured = Paired()
    for round_no, name in enumerate(order):
        kind = kinds[name]
        workers = await run.fleet.workers(1, CLERK_QUEUES, kind.launcher, env=kind.env)
        await warm_up(run)
        due = await clerk_backlog(run, count, f"{label[0]}{round_no}")
        await until_due(due, ahead=0.2)
        processes = [psutil.Process(worker.process.pid) for worker in workers]
        profile = profiler(run, f"worker-{label}-{name}-{round_no}", workers[0], None)
        before = sum(sum(process.cpu_times()[:2]) for process in processes)
        async with during(name, [str(worker.metrics_url) for worker in workers]):
            started = await until_due(due)
            ended = await run.wait_queue_empty(max(60.0, count / 50))
        used = sum(sum(process.cpu_times()[:2]) for process in processes) - before
        if profile:
            profile.cancel()
        measured.add(name, None, used / count * 1000)
        run.log(
            f"  drain, {label} {name:3s} {count} jobs in {ended - started:6.2f} s: "
            f"{measured.cpu[name][-1]:5.2f} worker CPU ms/job"
        )
        await run.fleet.release_workers()  # each round's worker a new one
        await run.reset_inbox()
    return measured
