"""Two kinds of the same process measured side by side: the intake's req/s, a worker's CPU per Clerk event.

What a feature costs (the metrics, the traces) is measured by running the
product with it and without it in the same run, in alternating order, so a
slow moment of a shared machine spoils one round, not one kind. Each round
(one run of each kind) gives a cost; the median of those is the figure.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psutil

from bench import loadgen
from bench.backlog import until_due
from bench.deliveries import stripe_set
from bench.measures import cpu_seconds, profiler
from bench.phase_drain import clerk_backlog, warm_up
from bench.processes import Managed

if TYPE_CHECKING:
    from bench.harness import Run

DRAIN_EVENTS = 5_000  # per drain, at most: CPU per job does not depend on the backlog's size
During = Callable[[str, str], contextlib.AbstractAsyncContextManager[None]]
"""What runs beside each measurement (a scraper of the /metrics of the kind with metrics), given the kind and its
base URL."""


@contextlib.asynccontextmanager
async def _nothing(_: str, __: str) -> AsyncIterator[None]:
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
    costs = [1 - on / off for on, off in zip(rps["on"], rps["off"], strict=True)]
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
    run: Run, label: str, servers: Mapping[str, tuple[str, Managed]], rounds: int, during: During = _nothing
) -> Paired:
    """``rounds`` rounds of Stripe intake against each kind's API (``servers``: kind -> URL, process), in turn."""
    mode, secret = run.mode, run.env["STRIPE_WEBHOOK_SECRET"]
    cap = 12_000 if run.use_wrk and loadgen.wrk_path() else 6_000
    kinds, measured = list(servers), Paired()
    for round_no in range(rounds):
        for kind in kinds if round_no % 2 == 0 else kinds[::-1]:
            url, server = servers[kind]
            signed = stripe_set(secret, int(mode.intake_seconds * cap) + 1000, f"{label[0]}{kind}{round_no:02d}")
            lines, template = signed.write(run.directory, f"{label}-{kind}-{round_no}")
            cpu_before = cpu_seconds(server)
            async with during(kind, url):
                result = await loadgen.run_closed_loop(
                    url, lines, template, seconds=mode.intake_seconds, connections=mode.connections, use_wrk=run.use_wrk
                )
            lines.unlink()
            cpu_us = (cpu_seconds(server) - cpu_before) / max(1, result.requests) * 1e6
            measured.add(kind, result.rps, cpu_us)
            run.log(f"  intake, {label} {kind:3s} {result.rps:8.0f} req/s  server CPU {cpu_us:5.0f} us/request")
        await run.reset_inbox()
    return measured


async def paired_drains(
    run: Run,
    label: str,
    order: Sequence[str],
    start: Callable[[str], Awaitable[tuple[Managed, str]]],
    during: During = _nothing,
) -> Paired:
    """A Clerk backlog drained by one fresh worker of each kind of ``order`` in turn; each one's CPU ms per event.

    ``start(kind)``: the kind's worker, started, and the URL ``during`` is given.
    """
    count = min(run.mode.drain_events, DRAIN_EVENTS)
    await run.stop_workers()
    measured = Paired()
    for round_no, kind in enumerate(order):
        worker, url = await start(kind)
        await warm_up(run)
        due = await clerk_backlog(run, count, f"{label[0]}{round_no}")
        await until_due(due, ahead=0.2)
        process = psutil.Process(worker.process.pid)
        profile = profiler(run, f"worker-{label}-{kind}-{round_no}", worker, None)
        before = process.cpu_times()
        async with during(kind, url):
            started = await until_due(due)
            ended = await run.wait_queue_empty(max(60.0, count / 50))
        after = process.cpu_times()
        if profile:
            profile.cancel()
        measured.add(kind, None, (after.user + after.system - before.user - before.system) / count * 1000)
        run.log(
            f"  drain, {label} {kind:3s} {count} jobs in {ended - started:6.2f} s: "
            f"{measured.cpu[kind][-1]:5.2f} worker CPU ms/job"
        )
        await run.stop_workers()
        await run.reset_inbox()
    return measured


async def stopped(run: Run, servers: Mapping[str, tuple[str, Managed]]) -> None:
    for _, server in servers.values():
        await asyncio.to_thread(run.processes.stop, server)
