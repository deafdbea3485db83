"""Tenants of one queue served in turn, through real worker processes: a flood of one tenant holds up no other.

A job asked for now takes its tenant's turn (``app/queue/fairness.py``): the
tests flood a queue with one tenant's jobs, add a few of another's, and read
the order the workers started them from the events table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from app.core.resources import Resources
from tests.queue.conftest import fetch_events, wait_for
from tests.queue.sample_jobs import RecordData, RecordJob, TenantRecordData, TenantRecordJob

pytestmark = pytest.mark.slow


async def _starts(resources: Resources) -> list[str]:
    return [e["key"] for e in await fetch_events(resources) if e["event"] == "start"]


async def _started(resources: Resources, keys: set[str]) -> bool:
    """Every job of ``keys`` started: the order so far is the order that matters."""
    return keys <= set(await _starts(resources))


async def _flood(resources: Resources, count: int, sleep_seconds: float = 0.0) -> None:
    """``count`` jobs of tenant ``flood``, queued at once (one call per 500)."""
    for start in range(0, count, 500):
        batch = range(start, min(start + 500, count))
        items = [(RecordData(key=f"flood-{n}", sleep_seconds=sleep_seconds), f"flood-{n}") for n in batch]
        await resources.queue.add_many(RecordJob, items, tenant_keys=["flood"] * len(items))


async def test_another_tenants_jobs_start_before_a_tenth_of_a_flood_queued_first(
    events_table: Resources, start_worker: Callable[..., Any]
) -> None:
    """A SaaS developer's jobs take part: one names its tenant on ``add``, the other through its class's field."""
    resources = events_table
    await _flood(resources, 400)
    await resources.queue.add(RecordJob, RecordData(key="other-a"), tenant_key="workspace-7")
    await resources.queue.add(TenantRecordJob, TenantRecordData(key="other-b", workspace="workspace-8"))
    await start_worker(WORKER_MAX_JOBS="2")

    await wait_for(lambda: _started(resources, {"other-a", "other-b"}), 60, "the other tenants' jobs to start")
    starts = await _starts(resources)
    floods_before = {
        key: sum(k.startswith("flood-") for k in starts[: starts.index(key)]) for key in ("other-a", "other-b")
    }
    assert max(floods_before.values()) < 40, floods_before  # not behind the flood: a tenth of it at most


async def test_a_tenant_alone_keeps_every_slot_of_the_worker_busy(
    events_table: Resources, start_worker: Callable[..., Any]
) -> None:
    """Turns never leave a worker idle: one tenant's 60 jobs of 0.2 s run five at a time on five slots."""
    resources = events_table
    await _flood(resources, 60, sleep_seconds=0.2)
    await start_worker(WORKER_MAX_JOBS="5")

    async def all_ended() -> bool:
        return len([e for e in await fetch_events(resources) if e["event"] == "end"]) >= 60

    await wait_for(all_ended, 60, "the tenant's jobs to end")
    events = sorted(await fetch_events(resources), key=lambda e: e["at"])
    running, busiest = 0, 0
    for event in events:
        running += 1 if event["event"] == "start" else -1
        busiest = max(busiest, running)
    assert busiest == 5
    started, ended = events[0]["at"], events[-1]["at"]
    assert (ended - started).total_seconds() < 60 * 0.2 / 5 * 2  # about 2.4 s: twice that at most


async def test_two_worker_processes_serve_tenants_in_turn_together(
    events_table: Resources, start_worker: Callable[..., Any]
) -> None:
    resources = events_table
    await _flood(resources, 400)
    for n in range(3):
        await resources.queue.add(RecordJob, RecordData(key=f"other-{n}"), tenant_key=f"workspace-{n}")
    await start_worker(WORKER_MAX_JOBS="2")
    await start_worker(WORKER_MAX_JOBS="2")

    async def others_started_and_both_workers_busy() -> bool:
        others_started = await _started(resources, {f"other-{n}" for n in range(3)})
        return others_started and len({e["pid"] for e in await fetch_events(resources)}) == 2

    await wait_for(others_started_and_both_workers_busy, 60, "the other tenants' jobs to start, on both workers")
    starts = await _starts(resources)
    others = [n for n, key in enumerate(starts) if key.startswith("other-")]
    assert max(others) < 40, others  # and both workers took their share: the wait above asks for it


async def test_a_retry_keeps_its_backoff_behind_no_turn(
    events_table: Resources, start_worker: Callable[..., Any]
) -> None:
    """A retry is due at its real time (now + backoff): not earlier because its tenant's turn came."""
    resources = events_table
    await resources.queue.add(
        RecordJob, RecordData(key="retried", fail_times=1, retry_later_seconds=1.5), tenant_key="workspace-1"
    )
    await start_worker()

    async def retried() -> bool:
        return len([e for e in await fetch_events(resources) if e["key"] == "retried"]) >= 3  # start, start, end

    await wait_for(retried, 20, "the job's retry to run")
    first, second = [e for e in await fetch_events(resources) if e["key"] == "retried" and e["event"] == "start"]
    assert (first["attempt"], second["attempt"]) == (1, 2)
    assert (second["at"] - first["at"]).total_seconds() >= 1.5
