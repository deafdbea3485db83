"""A worker frozen mid-attempt (SIGSTOP: its sockets stay open, as with a host that vanished) loses its locks
once its session has been idle for WEBHOOK_LOCK_IDLE_TIMEOUT_SECONDS (30 s by default, so within 60 s; 5 s here);
another worker then processes the event once, and the frozen one, resumed, applies nothing."""

from __future__ import annotations

import signal
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from sqlalchemy import text

from app.core.db import driver_connection
from app.core.resources import Resources
from app.webhooks.inbox import Inbox, event_lock_key
from app.webhooks.jobs import queue_processing
from tests.processes import wait_for, worker_starter
from tests.webhooks.worker_handlers import CREATE_TABLE, EMPTY_TABLE, PROVIDER, hold_key, holding_key

pytestmark = pytest.mark.slow(20)
# The product's idle timeout, shortened: the test proves the same with 5 s as production does with 30.
LOCK_IDLE_SECONDS = 5
# The frozen worker's job runs again on another worker once arq's in-progress key expires (timeout + 12 s):
# long enough that Postgres has ended the frozen session (LOCK_IDLE_SECONDS idle in its transaction) by then.
ENV = {
    "WEBHOOK_LOCK_IDLE_TIMEOUT_SECONDS": str(LOCK_IDLE_SECONDS),
    "WEBHOOK_JOB_TIMEOUT_SECONDS": str(LOCK_IDLE_SECONDS + 1),
    "WEBHOOK_RETRY_BASE_SECONDS": "0.1",
}


@pytest.fixture
async def start_worker(settings_env: dict[str, str]) -> AsyncIterator[Callable[..., Any]]:
    module = "tests.webhooks.worker_handlers:MODULE"
    async with worker_starter({**settings_env, **ENV}, "--module", module, "--queues", "webhook-queue") as start:
        yield start


async def lock_held(resources: Resources, row_id: int) -> bool:
    query = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND (classid::bigint << 32 | objid::bigint) = $1"
    async with driver_connection(resources.db) as connection:
        return bool(await connection.fetchval(query, event_lock_key(row_id)))


async def effects(resources: Resources, event_id: str) -> int:
    async with resources.db.session() as session:
        query = text("SELECT count(*) FROM webhook_test_success WHERE event_id = :e")
        return int(await session.scalar(query, {"e": event_id}) or 0)


async def processed_at(resources: Resources, row_id: int) -> Any:
    async with driver_connection(resources.db) as connection:
        return await connection.fetchval("SELECT processed_at FROM webhook_event WHERE id = $1", row_id)


async def test_a_frozen_workers_locks_are_released_and_another_worker_processes_the_event_once(
    resources: Resources, start_worker: Callable[..., Any]
) -> None:
    async with resources.db.session() as session:
        await session.execute(text(CREATE_TABLE))
        await session.execute(text(EMPTY_TABLE))
        await session.commit()
    namespace = resources.settings.redis_namespace
    await resources.redis.set(hold_key(namespace), "1")
    stored = await Inbox(resources.db).store(PROVIDER, "evt_frozen", "test.event", '{"id": "evt_frozen"}')
    frozen = await start_worker()
    await queue_processing(resources.queue, PROVIDER, stored.row_id)
    await wait_for(lambda: resources.redis.exists(holding_key(namespace)), 30, "the attempt to be mid-transaction")
    assert await lock_held(resources, stored.row_id)

    frozen.signal(signal.SIGSTOP)
    frozen_at = time.monotonic()
    try:
        await resources.redis.delete(hold_key(namespace))
        await wait_for(lambda: _released(resources, stored.row_id), 60, "Postgres to end the frozen session")
        assert time.monotonic() - frozen_at < 2 * LOCK_IDLE_SECONDS
        await start_worker()
        await wait_for(lambda: processed_at(resources, stored.row_id), 60, "another worker to process the event")
        done_at = await processed_at(resources, stored.row_id)
    finally:
        frozen.signal(signal.SIGCONT)
    await frozen.wait_log("Job ProcessWebhookEventJob failed", within=30)  # its connection is gone
    assert await effects(resources, "evt_frozen") == 1
    assert await processed_at(resources, stored.row_id) == done_at


async def _released(resources: Resources, row_id: int) -> bool:
    return not await lock_held(resources, row_id)
