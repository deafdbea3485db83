"""``queue.add`` in the API process: deduplication, bounded waits, and the sync driver."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from app.core.resources import Resources
from app.core.settings import load_settings
from app.queue.arq_adapter import queue_key
from app.queue.arq_driver import ArqQueue
from app.queue.errors import PermanentError, QueueUnavailableError
from app.queue.sync_driver import SyncQueue
from app.runtime import open_resources
from app.testing.processes import free_port
from tests.queue.conftest import fetch_events
from tests.queue.sample_jobs import RecordData, RecordJob


async def test_fifty_concurrent_adds_with_one_id_make_one_job(resources: Resources) -> None:
    results = await asyncio.gather(
        *(resources.queue.add(RecordJob, RecordData(key="same"), deduplication_id="one-id") for _ in range(50))
    )

    assert [r for r in results if r is not None] == [f"{resources.settings.redis_namespace}one-id"]
    queued = await resources.redis.zrange(queue_key(resources.settings, "default-queue"), 0, -1)
    assert queued == [f"{resources.settings.redis_namespace}one-id".encode()]
    assert await resources.queue.state("one-id", "default-queue") == "queued"


async def test_a_delayed_job_is_deferred_and_holds_its_id(resources: Resources) -> None:
    first = await resources.queue.add(
        RecordJob, RecordData(key="later"), delay=timedelta(minutes=5), deduplication_id="later"
    )

    assert first is not None
    assert await resources.queue.state("later", "default-queue") == "deferred"
    assert await resources.queue.add(RecordJob, RecordData(key="later"), deduplication_id="later") is None
    assert await resources.queue.state("never-queued", "default-queue") == "absent"


async def test_add_refuses_data_of_another_type(resources: Resources) -> None:
    with pytest.raises(TypeError, match="RecordJob takes RecordData"):
        await resources.queue.add(RecordJob, {"key": "not a struct"})


@pytest.fixture
def silent_server() -> Iterator[int]:
    """Accepts TCP connections and never answers: a hung Redis."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for connection in accepted:
        connection.close()
    listener.close()


@pytest.mark.parametrize("server", ["closed port", "hung server"])
async def test_add_against_an_unreachable_redis_fails_within_two_seconds(
    settings_env: dict[str, str], server: str, request: pytest.FixtureRequest
) -> None:
    port = free_port() if server == "closed port" else request.getfixturevalue("silent_server")
    settings = load_settings({**settings_env, "REDIS_URL": f"redis://127.0.0.1:{port}/0"})
    resources = open_resources(settings, ())
    assert isinstance(resources.queue, ArqQueue)
    try:
        started = time.monotonic()
        with pytest.raises(
            QueueUnavailableError, match=f"Could not queue RecordJob: Redis at redis://127.0.0.1:{port}"
        ):
            await resources.queue.add(RecordJob, RecordData(key="x"), deduplication_id="x")
        assert time.monotonic() - started < 2.0
    finally:
        await resources.close()


async def test_the_sync_driver_runs_the_job_inside_add(sync_resources: Resources) -> None:
    assert isinstance(sync_resources.queue, SyncQueue)

    job_id = await sync_resources.queue.add(RecordJob, RecordData(key="inline"), deduplication_id="inline")

    assert job_id is not None
    events = await fetch_events(sync_resources)
    assert [(e["key"], e["event"], e["attempt"]) for e in events] == [("inline", "start", 1), ("inline", "end", 1)]
    assert await sync_resources.queue.state("inline", "default-queue") == "absent"


async def test_the_sync_driver_raises_the_job_failure_to_the_caller(sync_resources: Resources) -> None:
    with pytest.raises(PermanentError, match="planned permanent failure"):
        await sync_resources.queue.add(RecordJob, RecordData(key="bad", permanent=True))
    with pytest.raises(TypeError):
        await sync_resources.queue.add(RecordJob, "not RecordData")
