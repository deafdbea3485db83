"""Fixtures of the queue tests: the test table, real worker processes, a private redis-server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from app.core.resources import Resources
from app.core.settings import load_settings
from app.runtime import open_resources
from app.testing.processes import free_port
from tests.processes import WorkerProc, wait_for, worker_starter
from tests.queue.sample_jobs import CREATE_TABLE
from tests.stubs.redis_server import RedisServer

__all__ = ["RedisServer", "WorkerProc", "fetch_events", "free_port", "wait_for"]

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_MODULE = "tests.queue.sample_jobs:MODULE"


@pytest.fixture
async def events_table(resources: Resources) -> Resources:
    async with resources.db.session() as session:
        await session.execute(text(CREATE_TABLE))
        await session.execute(text("TRUNCATE queue_test_event RESTART IDENTITY"))
        await session.commit()
    return resources


async def fetch_events(resources: Resources, job: str | None = None) -> list[dict[str, Any]]:
    query = "SELECT job, key, event, attempt, pid, at FROM queue_test_event"
    query += " WHERE job = :job ORDER BY id" if job else " ORDER BY id"
    async with resources.db.session() as session:
        rows = await session.execute(text(query), {"job": job} if job else {})
        return [dict(row._mapping) for row in rows]


@pytest.fixture
async def sync_resources(settings_env: dict[str, str], events_table: Resources) -> AsyncIterator[Resources]:
    """Resources of a process whose queue runs jobs inline (``MESSAGE_QUEUE_DRIVER=sync``)."""
    resources = open_resources(load_settings({**settings_env, "MESSAGE_QUEUE_DRIVER": "sync"}), ())
    yield resources
    await resources.close()


@pytest.fixture
async def start_worker(settings_env: dict[str, str]) -> AsyncIterator[Callable[..., Any]]:
    """Workers that load the sample jobs and serve the default queue (more options per call)."""
    async with worker_starter(settings_env, "--module", SAMPLE_MODULE, "--queues", "default-queue") as start:
        yield start


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    server = RedisServer(maxmemory_policy="allkeys-lru").start()
    yield server
    server.kill()
