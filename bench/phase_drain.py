"""Phase 3, drain: backlogs drained by one and by two worker processes.

A backlog of Clerk events (rows stored as the intake stores them, their jobs
queued to become due at one instant while the workers poll: ``bench/backlog.py``),
and the same number of no-op and one-UPDATE jobs (``bench/jobs.py``, on the same
queue) as references, each timed from that instant until the queue is empty.

One worker's drains are noisy on a shared machine (the same code drained 416 to
481 Clerk events/s within two hours), so ``drain_rounds`` rounds run them
in mirrored order (Clerk then the references, the references then Clerk, ...),
and each rate is every round's jobs over every round's seconds.
"""

from __future__ import annotations

import json
import os
import statistics
from typing import TYPE_CHECKING

import psutil

from bench.backlog import Due, due_in, queue_due, queue_events_due, until_due
from bench.deliveries import clerk_mix
from bench.harness import CLERK_QUEUES
from bench.inbox import store_events
from bench.jobs import ITEM_TABLE, BenchItem, BenchNoopJob, BenchUpdateJob
from bench.measures import profiler, service_cpu_seconds

if TYPE_CHECKING:
    from bench.harness import Run


async def drain(run: Run) -> None:
    count = run.mode.drain_events
    await run.fleet.workers(1, CLERK_QUEUES)
    await warm_up(run)
    kinds = ("clerk", "update", "noop")
    rates: dict[str, list[float]] = {kind: [] for kind in kinds}
    cpu_ms: dict[str, list[float]] = {kind: [] for kind in kinds}
    for round_ in range(run.mode.drain_rounds):
        suffix = "1w" if round_ == 0 else f"1w #{round_ + 1}"
        mirrored = round_ % 2 == 1
        if mirrored:
            noop, update = await _reference_drains(run, suffix)
        clerk = await _clerk_drain(run, count, f"clerk {suffix}", "d1", f"round {round_ + 1}")
        if not mirrored:
            noop, update = await _reference_drains(run, suffix)
        for kind, rate in zip(kinds, (clerk, update, noop), strict=True):
            rates[kind].append(rate)
            cpu_ms[kind].append(run.cpu_ms[f"{kind} {suffix}"])
    if run.mode.drain_rounds > 1:
        run.notes.append(
            "drain 1w, each round (Clerk / update / no-op, events/s): "
            + "; ".join(f"{c:.0f} / {u:.0f} / {n:.0f}" for c, u, n in zip(*rates.values(), strict=True))
        )
    run.results.update(
        drain_eps_1w=overall_rate(rates["clerk"]),
        noop_eps=overall_rate(rates["noop"]),
        update_eps=overall_rate(rates["update"]),
        drain_cpu_ms_1w=statistics.fmean(cpu_ms["clerk"]),
        noop_cpu_ms=statistics.fmean(cpu_ms["noop"]),
        update_cpu_ms=statistics.fmean(cpu_ms["update"]),
        # The worker, Postgres and Redis share this machine: with one worker they keep some cores busy
        # per event, so no number of workers drains faster than cores / those cores (x that rate).
        drain_2w_machine_bound=min(2.0, (os.cpu_count() or 1) / max(run.pipeline_cores["clerk 1w"], 0.01)),
    )

    await run.fleet.workers(2, CLERK_QUEUES)
    await warm_up(run)
    run.results["drain_eps_2w"] = await _clerk_drain(run, count, "clerk 2w", "d2", "2 workers")
    if run.mode.reference_drains_2w:
        noop2, update2 = await _reference_drains(run, "2w")
        run.results.update(noop_eps_2w=noop2, update_eps_2w=update2)
    await run.fleet.release_workers()
    await run.reset_inbox()


async def one_worker_clerk_drain(run: Run, label: str, tag: str) -> tuple[float, float]:
    """What the drain phase measures first, as a reference for another phase: one worker (warmed up) draining a
    Clerk backlog (``pipeline_reference_events`` at most); its rate (events/s) and worker CPU (ms per event)."""
    await run.fleet.workers(1, CLERK_QUEUES)
    await warm_up(run)
    rate = await _clerk_drain(run, min(run.mode.drain_events, run.mode.pipeline_reference_events), label, tag, label)
    await run.reset_inbox()
    return rate, run.cpu_ms[label]


def overall_rate(rates: list[float]) -> float:
    """Every round's jobs over every round's seconds (each round drains the same count): not their mean."""
    return statistics.harmonic_mean(rates)


async def _clerk_drain(run: Run, count: int, label: str, tag: str, check: str) -> float:
    """A fresh inbox, a backlog of ``count`` Clerk events drained; its rate."""
    await run.reset_inbox()
    rate = await _drain(run, label, count, await clerk_backlog(run, count, tag))
    await _check_clerk(run, count, check)
    return rate


async def _drain(run: Run, label: str, count: int, due: Due) -> float:
    """Time the backlog due at ``due`` until the queue is empty; the CPU counters are read just before."""
    timeout = max(60.0, count / 50)
    await until_due(due, ahead=0.2)
    workers = run.fleet.running
    profile = profiler(run, f"worker-{label}", workers[0], None) if run.profile else None
    cpu = [psutil.Process(worker.process.pid) for worker in workers]
    cpu_before = [process.cpu_times() for process in cpu]
    services_before = service_cpu_seconds()
    psutil.cpu_percent()
    started = await until_due(due)
    ended = await run.wait_queue_empty(timeout)
    machine = psutil.cpu_percent()
    services = {name: (seconds - services_before.get(name, 0.0)) for name, seconds in service_cpu_seconds().items()}
    if profile:
        profile.cancel()
    seconds = ended - started
    busy = [
        (after.user + after.system - before.user - before.system) / seconds * 100
        for before, after in zip(cpu_before, (process.cpu_times() for process in cpu), strict=True)
    ]
    rate = count / seconds
    cpu_ms = sum(busy) / 100 * seconds / count * 1000
    run.cpu_ms[label] = cpu_ms
    run.machine_cores[label] = machine / 100 * (os.cpu_count() or 1)
    run.pipeline_cores[label] = sum(busy) / 100 + sum(services.values()) / seconds
    shares = ", ".join(f"{name} {used / seconds:.2f}" for name, used in services.items())
    run.log(
        f"  drain {label:12s} {count} jobs in {seconds:6.2f} s: {rate:7.0f} /s  {cpu_ms:5.2f} worker CPU ms/job "
        f"(worker CPU {', '.join(f'{b:.0f}%' for b in busy)}; machine {machine:.0f}% of {os.cpu_count()} cores; "
        f"cores used by {shares})"
    )
    if label.startswith("clerk"):
        run.notes.append(
            f"drain {label}: cores busy: workers {sum(busy) / 100:.2f}, {shares}, "
            f"machine {run.machine_cores[label]:.2f} of {os.cpu_count()}"
        )
    return rate


async def clerk_backlog(run: Run, count: int, tag: str) -> Due:
    """``count`` Clerk events stored, their jobs queued to be due at the instant returned."""
    events = clerk_mix(count, tag, seed=sum(map(ord, tag)))
    rows = await store_events(run, "clerk", [(event.event_id, json.loads(event.body)) for event in events])
    due = due_in(len(rows))
    await queue_events_due(run, rows, due)
    return due


async def _check_clerk(run: Run, count: int, label: str) -> None:
    row = await run.pool.fetchrow(
        "SELECT count(*) FILTER (WHERE processed_at IS NOT NULL) AS done, "
        "count(*) FILTER (WHERE last_error IS NOT NULL OR attempts > 1) AS retried FROM webhook_event"
    )
    if row["done"] != count:
        run.notes.append(f"drain {label}: {row['done']} of {count} events processed")
    if row["retried"]:
        run.notes.append(f"drain {label}: {row['retried']} events needed more than one attempt")


async def _reference_drains(run: Run, suffix: str) -> tuple[float, float]:
    count = run.mode.drain_events
    items = [(BenchItem(id=n), None, None) for n in range(1, count + 1)]
    due = due_in(count)
    await queue_due(run, BenchNoopJob, items, due)
    noop = await _drain(run, f"noop {suffix}", count, due)
    await run.pool.execute(f"TRUNCATE {ITEM_TABLE}")
    await run.pool.execute(f"INSERT INTO {ITEM_TABLE} (id) SELECT generate_series(1, $1::int)", count)
    due = due_in(count)
    await queue_due(run, BenchUpdateJob, items, due)
    update = await _drain(run, f"update {suffix}", count, due)
    done = await run.pool.fetchval(f"SELECT count(*) FROM {ITEM_TABLE} WHERE n = 1")
    if done != count:
        run.notes.append(f"update drain {suffix}: {done} of {count} rows updated once")
    return noop, update


async def warm_up(run: Run) -> None:
    """A few Clerk events through every worker first: a fresh worker prepares its statements on the way."""
    await run.reset_inbox()
    await until_due(await clerk_backlog(run, max(50, run.mode.drain_events // 20), "warm"))
    await run.wait_queue_empty(within=60.0)
    await run.reset_inbox()
