"""Transactional enqueue: ``add(..., session=...)`` queues a job if and only if its transaction commits."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from app.core.resources import Resources
from app.core.settings import load_settings
from app.queue.arq_adapter import queue_key
from app.queue.arq_driver import ArqQueue
from app.queue.encoded import EncodedJob
from app.queue.models import JobOutbox
from app.queue.outbox import OutboxRelayLoop, relay
from app.runtime import open_resources
from app.testing.processes import child_env, free_port
from app.webhooks.models import WebhookEvent
from tests.processes import ROOT
from tests.queue.conftest import fetch_events, wait_for
from tests.queue.sample_jobs import RecordData, RecordJob


async def staged_job_ids(resources: Resources) -> list[str]:
    async with resources.db.session() as session:
        return list((await session.scalars(select(JobOutbox.job_id).order_by(JobOutbox.id))).all())


async def queued_ids(resources: Resources) -> list[bytes]:
    return list(await resources.redis.zrange(queue_key(resources.settings, "default-queue"), 0, -1))


async def stage_and_commit(resources: Resources, data: RecordData, **options: Any) -> str:
    async with resources.db.session() as session:
        job_id = await resources.queue.add(RecordJob, data, session=session, **options)
        await session.commit()
    assert job_id is not None
    return job_id


async def test_a_job_staged_in_a_transaction_that_rolls_back_is_never_queued(resources: Resources) -> None:
    async with resources.db.session() as session:
        data = RecordData(key="rolled-back")
        await resources.queue.add(RecordJob, data, deduplication_id="rolled-back", session=session)
        await session.flush()  # the row was written in the transaction, then rolled back with it
        await session.rollback()
        assert await resources.queue.relay_outbox(session=session) == 0

    assert await resources.queue.relay_outbox() == 0
    assert await staged_job_ids(resources) == []
    assert await queued_ids(resources) == []
    assert await resources.queue.state("rolled-back", "default-queue") == "absent"


@pytest.mark.slow
async def test_a_job_staged_in_a_committed_transaction_is_queued_and_run(
    events_table: Resources, start_worker: Callable[..., Any]
) -> None:
    resources = events_table
    async with resources.db.session() as session:
        job_id = await resources.queue.add(
            RecordJob, RecordData(key="committed"), deduplication_id="committed", session=session
        )
        # nothing reaches Redis before the commit
        assert await resources.queue.state("committed", "default-queue") == "absent"
        await session.commit()

    assert job_id == f"{resources.settings.redis_namespace}committed"
    assert await staged_job_ids(resources) == [job_id]
    assert await resources.queue.relay_outbox(session=session) == 1
    assert await staged_job_ids(resources) == []
    assert await resources.queue.state("committed", "default-queue") == "queued"

    await start_worker()

    async def ran() -> list[tuple[str, str]]:
        return [(e["key"], e["event"]) for e in await fetch_events(resources) if e["event"] == "end"]

    assert await wait_for(ran, 10, "the relayed job to run") == [("committed", "end")]


async def test_a_staged_delay_counts_from_staging(resources: Resources) -> None:
    await stage_and_commit(resources, RecordData(key="later"), delay=timedelta(minutes=5), deduplication_id="later")
    assert await resources.queue.relay_outbox() == 1

    assert await resources.queue.state("later", "default-queue") == "deferred"
    (score,) = [
        s
        for _, s in await resources.redis.zrange(queue_key(resources.settings, "default-queue"), 0, 0, withscores=True)
    ]
    assert 4 * 60 < score / 1000 - time.time() <= 5 * 60


async def test_a_row_relayed_twice_is_queued_once(resources: Resources) -> None:
    """A relay that dies between queueing and deleting leaves the row; the next relay queues the same id."""
    job_id = await stage_and_commit(resources, RecordData(key="twice"))  # no deduplication id: one fixed when staged
    queue = resources.queue
    assert isinstance(queue, ArqQueue)

    async def queue_then_die(jobs: list[EncodedJob]) -> None:
        await queue.enqueue_encoded(jobs, what="test")
        raise ConnectionResetError("the relay's process died before its commit")

    with pytest.raises(ConnectionResetError):
        await relay(resources.db, queue_then_die)
    assert await staged_job_ids(resources) == [job_id]

    assert await queue.relay_outbox() == 1
    assert await staged_job_ids(resources) == []
    assert await queued_ids(resources) == [job_id.encode()]


async def test_the_sync_driver_runs_a_staged_job_when_relayed(sync_resources: Resources) -> None:
    await stage_and_commit(sync_resources, RecordData(key="staged"))
    assert await fetch_events(sync_resources) == []

    assert await sync_resources.queue.relay_outbox() == 1
    assert [(e["key"], e["event"]) for e in await fetch_events(sync_resources)] == [
        ("staged", "start"),
        ("staged", "end"),
    ]
    assert await staged_job_ids(sync_resources) == []


async def test_the_relay_loop_keeps_rows_while_redis_refuses_and_warns_once(
    settings_env: dict[str, str], resources: Resources, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="app.queue.outbox")
    job_id = await stage_and_commit(resources, RecordData(key="outage"))
    refused = open_resources(load_settings({**settings_env, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}), ())
    try:
        loop = OutboxRelayLoop(refused.queue, interval_seconds=0.02)
        running = asyncio.create_task(loop.run())
        await asyncio.sleep(1.0)  # dozens of failed rounds
        loop.stop()
        await asyncio.wait_for(running, 5)
    finally:
        await refused.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "stay in job_outbox" in warnings[0], warnings
    assert await staged_job_ids(resources) == [job_id]

    loop.queue = resources.queue  # Redis answers again
    assert await loop.relay_round() == 1
    assert await queued_ids(resources) == [job_id.encode()]
    assert "relayed to the queue again" in caplog.records[-1].getMessage()


async def test_relaying_a_committed_transactions_jobs_while_redis_is_down_returns_and_a_worker_queues_them_later(
    settings_env: dict[str, str], resources: Resources, caplog: pytest.LogCaptureFixture
) -> None:
    """The job guide's pattern: commit, then ``relay_outbox(session=...)``. Redis down is no error of the caller's:
    the job is safe in the outbox."""
    caplog.set_level(logging.WARNING, logger="app.queue.outbox")
    refused = open_resources(load_settings({**settings_env, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}), ())
    try:
        async with refused.db.session() as session:
            job_id = await refused.queue.add(RecordJob, RecordData(key="redis-down"), session=session)
            await session.commit()
        assert await refused.queue.relay_outbox(session=session) == 0  # returns: no QueueUnavailableError
    finally:
        await refused.close()
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "1 job(s) staged in a committed transaction wait in job_outbox" in warning
    assert warning.endswith("A worker queues them once Redis answers.")
    assert await staged_job_ids(resources) == [job_id]

    assert await OutboxRelayLoop(resources.queue).relay_round() == 1  # a worker's relay, Redis answering
    assert await staged_job_ids(resources) == []
    assert await queued_ids(resources) == [str(job_id).encode()]


@pytest.mark.slow
async def test_a_job_staged_by_a_process_killed_right_after_its_commit_is_queued_by_a_worker_within_seconds(
    settings_env: dict[str, str], events_table: Resources, start_worker: Callable[..., Any]
) -> None:
    resources = events_table
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.queue.outbox_child",
        "evt_killed",
        cwd=ROOT,
        env=child_env(settings_env),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        assert await asyncio.wait_for(child.stdout.readline(), 30) == b"committed\n"
    finally:
        child.kill()  # SIGKILL: right after the commit, before the relay
        await child.wait()
    assert child.returncode == -signal.SIGKILL
    async with resources.db.session() as session:
        event = (await session.scalars(select(WebhookEvent))).one()
    assert event.processed_at is not None  # the handler's transaction committed, with the staged job
    assert len(await staged_job_ids(resources)) == 1
    assert await queued_ids(resources) == []

    await start_worker()
    started = time.monotonic()

    async def ran() -> list[dict[str, Any]]:
        return [e for e in await fetch_events(resources) if e["key"] == "evt_killed" and e["event"] == "end"]

    await wait_for(ran, 5, "a worker to relay and run the job the killed process staged")
    assert time.monotonic() - started < 5
    assert await staged_job_ids(resources) == []
    assert len(await ran()) == 1


@pytest.mark.slow
async def test_a_burst_worker_relays_what_is_staged_then_runs_it(
    events_table: Resources, start_worker: Callable[..., Any]
) -> None:
    await stage_and_commit(events_table, RecordData(key="burst"))

    worker = await start_worker("--burst", wait=None)

    assert await worker.wait_exit() == 0
    assert [(e["key"], e["event"]) for e in await fetch_events(events_table)] == [("burst", "start"), ("burst", "end")]
    assert await staged_job_ids(events_table) == []
