"""Redis faults seen by a running worker: it warns about eviction, survives a restart and goes on."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from app.core.resources import Resources
from app.core.settings import load_settings
from app.runtime import open_resources
from tests.queue.conftest import RedisServer, fetch_events, wait_for
from tests.queue.sample_jobs import RecordData, RecordJob

pytestmark = pytest.mark.slow


async def test_the_worker_survives_a_redis_restart_and_runs_a_job_queued_after(
    settings_env: dict[str, str],
    events_table: Resources,
    start_worker: Callable[..., Any],
    private_redis: RedisServer,
) -> None:
    worker = await start_worker(REDIS_URL=private_redis.url)
    await worker.wait_log("REDIS MAXMEMORY-POLICY IS 'allkeys-lru', NOT 'noeviction'")

    private_redis.kill()
    await worker.wait_log("Redis unavailable")
    await asyncio.sleep(1.5)  # a few reconnect attempts while Redis is down
    assert worker.process.poll() is None
    private_redis.start()
    await worker.wait_log("connected to Redis again", within=15)

    resources = open_resources(load_settings({**settings_env, "REDIS_URL": private_redis.url}), ())
    try:
        await resources.queue.add(RecordJob, RecordData(key="after-restart"), deduplication_id="after-restart")

        async def ran() -> bool:
            return any(e["key"] == "after-restart" and e["event"] == "end" for e in await fetch_events(events_table))

        await wait_for(ran, 10, "the job queued after the restart to run")
    finally:
        await resources.close()
    assert worker.process.poll() is None
    assert worker.text().count("Redis unavailable") >= 2  # it kept logging while it waited
