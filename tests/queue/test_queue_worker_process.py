"""Real worker processes: deduplication over a job's life, sharing work, SIGTERM and SIGKILL."""

from __future__ import annotations

import asyncio
import signal
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from app.core.resources import Resources
from tests.queue.conftest import fetch_events, wait_for
from tests.queue.sample_jobs import RecordData, RecordJob, UnlistedJob

pytestmark = pytest.mark.slow

JOB_FIELDS = ("job_name", "job_id", "queue", "attempt")


async def _events(resources: Resources, key: str, event: str) -> list[dict[str, Any]]:
    return [e for e in await fetch_events(resources) if e["key"] == key and e["event"] == event]


async def test_the_deduplication_id_holds_while_waiting_running_and_retrying_and_frees_after_success(
    events_table: Resources, start_worker: Callable[..., Any]
) -> None:
    resources, queue = events_table, events_table.queue
    data = RecordData(key="dedup", sleep_seconds=1.0, fail_times=1, retry_later_seconds=2.0)
    assert await queue.add(RecordJob, data, retry_limit=3, deduplication_id="dedup") is not None
    assert await queue.state("dedup", "default-queue") == "queued"
    assert await queue.add(RecordJob, data, deduplication_id="dedup") is None  # waiting

    await start_worker()
    await wait_for(lambda: _events(resources, "dedup", "start"), 10, "the first try to start")
    assert await queue.state("dedup", "default-queue") == "in_progress"
    assert await queue.add(RecordJob, data, deduplication_id="dedup") is None  # running

    async def retrying() -> bool:
        return await queue.state("dedup", "default-queue") == "deferred"

    await wait_for(retrying, 10, "the job to wait for its retry")
    assert await queue.add(RecordJob, data, deduplication_id="dedup") is None  # between tries

    await wait_for(lambda: _events(resources, "dedup", "end"), 15, "the second try to succeed")

    async def freed() -> bool:
        return await queue.state("dedup", "default-queue") == "absent"

    await wait_for(freed, 5, "the id to be free")
    assert [e["attempt"] for e in await _events(resources, "dedup", "start")] == [1, 2]
    assert await queue.add(RecordJob, RecordData(key="dedup"), deduplication_id="dedup") is not None  # free again

    async def ran_again() -> bool:
        return len(await _events(resources, "dedup", "end")) == 2

    await wait_for(ran_again, 10, "the job queued again to run")


async def test_two_workers_share_200_jobs_and_never_run_one_twice_at_once(
    events_table: Resources, start_worker: Callable[..., Any]
) -> None:
    resources = events_table
    workers = await asyncio.gather(start_worker(), start_worker())
    keys = [f"job-{n}" for n in range(200)]
    # One pipelined call: 200 concurrent adds, each bounded to 1 s, can time out on a loaded machine.
    await resources.queue.add_many(RecordJob, [(RecordData(key=k, sleep_seconds=0.02), k) for k in keys])
    await resources.queue.add(UnlistedJob, RecordData(key="unlisted"), deduplication_id="unlisted")

    async def all_ended() -> bool:
        return len([e for e in await fetch_events(resources) if e["event"] == "end"]) >= 200

    await wait_for(all_ended, 30, "200 jobs to end")
    await asyncio.sleep(0.3)  # a second run, if any, would show up now

    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in await fetch_events(resources):
        runs[event["key"]].append(event)
    assert sorted(runs) == sorted(keys)
    for key, events in runs.items():
        assert [e["event"] for e in events] == ["start", "end"], key  # ran once, start then end
        assert events[0]["pid"] == events[1]["pid"]
    pids = {events[0]["pid"] for events in runs.values()}
    assert pids == {w.process.pid for w in workers}  # both workers took a share

    # A job of a module the worker does not load is reported by name, not run.
    await wait_for(
        lambda: any(w.has("Job UnlistedJob") and w.has("not listed in app/runtime.py") for w in workers),
        10,
        "the unlisted job to be reported",
    )
    assert await resources.queue.state("unlisted", "default-queue") == "absent"

    # Every line written while a job runs carries the job's context, stdlib lines included.
    lines = [line for w in workers for line in w.lines()]
    in_job = [line for line in lines if "job_name" in line]
    assert all(all(name in line for name in JOB_FIELDS) for line in in_job)
    stdlib = [line for line in in_job if str(line["event"]).startswith("sample job job-")]
    assert len(stdlib) == 200 and all(line["logger"] == "tests.sample_jobs" for line in stdlib)
    assert len([line for line in in_job if line["event"] == "sample job structlog line"]) == 200
    ends = [line for line in in_job if str(line["event"]).startswith("Job RecordJob finished")]
    assert len(ends) == 200 and all(line["duration_ms"] >= 20 for line in ends)
    starts = [line for line in in_job if str(line["event"]).startswith("Job RecordJob started")]
    assert len(starts) == 200 and {line["attempt"] for line in starts} == {1}


async def _started(resources: Resources, key: str) -> bool:
    return any(e["key"] == key and e["event"] == "start" for e in await fetch_events(resources))


async def test_sigterm_lets_the_running_job_finish_then_exits_0(
    events_table: Resources, start_worker: Callable[..., Any]
) -> None:
    resources = events_table
    worker = await start_worker()
    await resources.queue.add(RecordJob, RecordData(key="long", sleep_seconds=1.5), deduplication_id="long")
    await wait_for(lambda: _events(resources, "long", "start"), 10, "the job to start")

    worker.signal(signal.SIGTERM)
    await worker.wait_log("SIGTERM received")
    await resources.queue.add(RecordJob, RecordData(key="after"), deduplication_id="after")

    assert await worker.wait_exit(15) == 0
    assert len(await _events(resources, "long", "end")) == 1  # it finished before the exit
    assert await _events(resources, "after", "start") == []  # no new job after the signal
    assert await resources.queue.state("after", "default-queue") == "queued"  # left for another worker


@pytest.mark.slow(18)
async def test_sigkill_mid_job_another_worker_runs_it_again(
    events_table: Resources, start_worker: Callable[..., Any]
) -> None:
    resources = events_table
    first = await start_worker()
    await resources.queue.add(RecordJob, RecordData(key="killed", sleep_seconds=2.0), deduplication_id="killed")
    await wait_for(lambda: _events(resources, "killed", "start"), 10, "the job to start")

    first.signal(signal.SIGKILL)
    assert await first.wait_exit(5) == -signal.SIGKILL
    second = await start_worker()

    # RecordJob's timeout is 3 s: its in-progress key expires 3 + 2 + 10 s after the start.
    ends = await wait_for(lambda: _events(resources, "killed", "end"), 25, "another worker to run the job again")
    starts = await _events(resources, "killed", "start")
    assert [(s["pid"], s["attempt"]) for s in starts] == [(first.process.pid, 1), (second.process.pid, 2)]
    assert ends[0]["pid"] == second.process.pid
    assert (starts[1]["at"] - starts[0]["at"]).total_seconds() <= 3 + 2 + 10 + 2


async def test_a_job_still_running_after_the_grace_period_is_cancelled_and_stays_queued(
    events_table: Resources, start_worker: Callable[..., Any]
) -> None:
    resources = events_table
    worker = await start_worker(WORKER_SHUTDOWN_GRACE_SECONDS="1")
    await resources.queue.add(RecordJob, RecordData(key="slow", sleep_seconds=2.5), deduplication_id="slow")
    await wait_for(lambda: _events(resources, "slow", "start"), 10, "the job to start")

    worker.signal(signal.SIGTERM)

    assert await worker.wait_exit(10) == 0
    assert await _events(resources, "slow", "end") == []
    assert await resources.queue.state("slow", "default-queue") == "queued"  # another worker takes it at once
    assert worker.has("1 job(s) still running as the grace period ends")
