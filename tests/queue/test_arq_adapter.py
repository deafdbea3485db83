"""The arq adapter against the installed arq: what it writes is what arq's own API reads and runs.

``app/queue/arq_adapter.py`` is the one place that knows arq's keys: it writes
jobs (a job in one script call, a batch in one), and reads a job's state, a
queue's count and its first jobs. If arq changes how it stores jobs, these
tests fail, naming the adapter, before production does.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from arq.connections import ArqRedis
from arq.constants import job_key_prefix
from arq.jobs import Job as ArqJob
from arq.jobs import JobStatus
from arq.typing import WorkerCoroutine
from arq.worker import Worker, func

from app.core.resources import JobOptions, Resources
from app.queue import arq_adapter
from app.queue.arq_adapter import (
    CHECKED_ARQ_VERSION,
    DISPATCH_FUNCTION,
    job_state,
    peek,
    queue_key,
    queued_count,
    version_mismatch,
)
from app.queue.arq_driver import make_arq_redis
from app.queue.encoded import encode_job, encode_jobs, namespaced
from app.queue.serialization import deserialize, serialize
from tests.queue.sample_jobs import RecordData, RecordJob


def test_the_installed_arq_is_the_one_the_adapter_was_checked_against() -> None:
    assert version_mismatch() is None, version_mismatch()


def test_another_arq_version_is_named_with_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arq_adapter, "installed_arq_version", lambda: "0.29.0")
    message = version_mismatch()
    assert message is not None
    assert f"arq 0.29.0 is installed, but app/queue/arq_adapter.py writes arq's keys as arq {CHECKED_ARQ_VERSION}" in (
        message
    )
    assert "run tests/queue/test_arq_adapter.py" in message


def _job(resources: Resources, dedup: str) -> ArqJob:
    return ArqJob(
        namespaced(resources.settings, dedup),
        resources.queue.redis,  # type: ignore[attr-defined]
        _queue_name=queue_key(resources.settings, "default-queue"),
        _deserializer=deserialize,
    )


async def test_a_job_the_adapter_wrote_is_read_back_by_arqs_own_job_api(resources: Resources) -> None:
    queued = await resources.queue.add(
        RecordJob, RecordData(key="contract"), deduplication_id="contract", retry_limit=4, request_id="req-7"
    )
    later = await resources.queue.add(
        RecordJob, RecordData(key="later"), deduplication_id="later", delay=timedelta(hours=1)
    )
    assert queued is not None and later is not None

    job, deferred = _job(resources, "contract"), _job(resources, "later")
    assert await job.status() == JobStatus.queued
    assert await deferred.status() == JobStatus.deferred
    info = await job.info()
    assert info is not None
    assert info.function == DISPATCH_FUNCTION
    name, data = info.args  # JSON keeps the arguments as a list
    assert (name, data["key"]) == ("RecordJob", "contract")
    assert info.kwargs == {"retry_limit": 4, "request_id": "req-7"}
    assert info.job_try is None
    # A job asked for now is placed by its tenant's turn: in the past, so due at once; its key lives as long as
    # its retries need (arq would expire a past-scored job at once without an explicit lifetime).
    assert info.score < info.enqueue_time.timestamp() * 1000
    ttl = await resources.redis.pttl(job_key_prefix + namespaced(resources.settings, "contract"))
    assert ttl > 24 * 3600 * 1000


async def test_the_adapter_writes_the_bytes_enqueue_job_writes(resources: Resources) -> None:
    """The same job through arq's ``enqueue_job`` and through the adapter: the same envelope, byte for byte."""
    settings = resources.settings
    encoded = encode_job(settings, RecordJob, RecordData(key="bytes"), JobOptions(deduplication_id="via-adapter"))
    redis: ArqRedis = resources.queue.redis  # type: ignore[attr-defined]
    await redis.enqueue_job(
        DISPATCH_FUNCTION,
        encoded.name,
        encoded.data,
        _job_id=namespaced(settings, "via-arq"),
        _queue_name=queue_key(settings, "default-queue"),
        retry_limit=encoded.retry_limit,
    )
    await resources.queue.enqueue_encoded([encoded], what="the contract's job")  # type: ignore[attr-defined]
    ours = await redis.get(job_key_prefix + encoded.job_id)
    arqs = await redis.get(job_key_prefix + namespaced(settings, "via-arq"))
    assert ours is not None and arqs is not None
    mine, theirs = deserialize(ours), deserialize(arqs)
    mine.pop("et"), theirs.pop("et")  # the enqueue times, a few milliseconds apart
    assert mine == theirs
    assert await resources.queue.add(RecordJob, RecordData(key="bytes"), deduplication_id="via-arq") is None


async def test_a_batch_the_adapter_wrote_is_run_by_a_stock_worker(resources: Resources) -> None:
    """Three jobs in one script call, one of them already queued: a stock arq Worker runs the two, once each."""
    settings = resources.settings
    ran: list[tuple[str, Any, int]] = []

    async def record(ctx: dict[str, Any], name: str, data: Any, retry_limit: int, **_: Any) -> None:
        ran.append((name, data["key"], ctx["job_try"]))

    await resources.queue.add(RecordJob, RecordData(key="first"), deduplication_id="b-1")
    items = [(RecordData(key=key), f"b-{n}") for n, key in enumerate(("first", "second", "third"), start=1)]
    jobs = encode_jobs(settings, RecordJob, [(data, dedup, None) for data, dedup in items])
    queued = await resources.queue.enqueue_encoded(jobs, what="a batch")  # type: ignore[attr-defined]
    assert queued == [None, namespaced(settings, "b-2"), namespaced(settings, "b-3")]

    await _run_stock_worker(resources, record)
    assert sorted(ran) == [("RecordJob", key, 1) for key in ("first", "second", "third")]
    for dedup in ("b-1", "b-2", "b-3"):
        assert await _job(resources, dedup).status() == JobStatus.not_found  # done, and free again


async def _run_stock_worker(resources: Resources, run: WorkerCoroutine) -> None:
    """A stock arq Worker runs ``run`` for every job of the default queue, then stops (burst)."""
    settings = resources.settings
    pool = make_arq_redis(settings.require_redis_url(), timeout=5)
    worker = Worker(
        [func(run, name=DISPATCH_FUNCTION, keep_result=0)],
        queue_name=queue_key(settings, "default-queue"),
        redis_pool=pool,
        burst=True,
        handle_signals=False,
        keep_result=0,
        poll_delay=0.01,
        job_serializer=serialize,
        job_deserializer=deserialize,
    )
    try:
        await asyncio.wait_for(worker.async_run(), 10)
    finally:
        await worker.close()


async def _enqueue_with_arq(resources: Resources, name: str, dedup: str, **options: Any) -> None:
    """A job queued by arq's own ``enqueue_job``, as the adapter names the queue."""
    redis: ArqRedis = resources.queue.redis  # type: ignore[attr-defined]
    await redis.enqueue_job(
        DISPATCH_FUNCTION,
        name,
        {"key": dedup},
        _job_id=namespaced(resources.settings, dedup),
        _queue_name=queue_key(resources.settings, "default-queue"),
        **options,
    )


async def test_the_queued_count_is_every_job_arq_holds_on_the_queue_until_a_stock_worker_runs_them(
    resources: Resources,
) -> None:
    """Due and deferred, queued by the adapter or by arq itself: counted; run by a stock Worker: gone."""
    redis, settings = resources.redis, resources.settings
    assert await queued_count(redis, settings, "default-queue") == 0
    await resources.queue.add(RecordJob, RecordData(key="now"), deduplication_id="count-now")
    await resources.queue.add(
        RecordJob, RecordData(key="later"), deduplication_id="count-later", delay=timedelta(seconds=1)
    )
    await _enqueue_with_arq(resources, "RecordJob", "count-arq")
    assert await queued_count(redis, settings, "default-queue") == 3
    assert await queued_count(redis, settings, "other-queue") == 0

    ran: list[str] = []

    async def record(ctx: dict[str, Any], name: str, data: Any, **_: Any) -> None:
        ran.append(data["key"])

    await _run_stock_worker(resources, record)  # a burst Worker stops once the queue is empty: after the second
    assert sorted(ran) == ["count-arq", "later", "now"]
    assert await queued_count(redis, settings, "default-queue") == 0


async def test_peek_names_the_first_jobs_soonest_due_first_and_says_which_it_could_not_read(
    resources: Resources,
) -> None:
    redis, settings = resources.redis, resources.settings
    assert await peek(redis, settings, "default-queue", 10) == []
    await resources.queue.add(RecordJob, RecordData(key="c"), deduplication_id="peek-last", delay=timedelta(hours=1))
    await _enqueue_with_arq(resources, "SomeoneElsesJob", "peek-second", _defer_by=timedelta(minutes=30))
    await resources.queue.add(RecordJob, RecordData(key="a"), deduplication_id="peek-first")
    assert await peek(redis, settings, "default-queue", 10) == ["RecordJob", "SomeoneElsesJob", "RecordJob"]
    assert await peek(redis, settings, "default-queue", 1) == ["RecordJob"]

    await redis.delete(job_key_prefix + namespaced(settings, "peek-first"))  # gone since the queue was read
    await redis.set(job_key_prefix + namespaced(settings, "peek-second"), b"not json")  # unreadable
    assert await peek(redis, settings, "default-queue", 10) == [None, "RecordJob"]


async def test_a_jobs_state_follows_it_through_a_stock_worker(resources: Resources) -> None:
    """Queued, deferred, running while a stock Worker runs it, absent once it finished (no result is kept)."""
    redis, settings = resources.queue.redis, resources.settings  # type: ignore[attr-defined]
    running = namespaced(settings, "state-running")
    await resources.queue.add(RecordJob, RecordData(key="running"), deduplication_id="state-running")
    await resources.queue.add(
        RecordJob, RecordData(key="later"), deduplication_id="state-later", delay=timedelta(seconds=1)
    )
    assert await job_state(redis, settings, running, "default-queue") == "queued"
    assert await job_state(redis, settings, namespaced(settings, "state-later"), "default-queue") == "deferred"
    assert await job_state(redis, settings, namespaced(settings, "never"), "default-queue") == "absent"

    seen: list[str] = []

    async def record(ctx: dict[str, Any], name: str, data: Any, **_: Any) -> None:
        seen.append(await job_state(redis, settings, ctx["job_id"], "default-queue"))

    await _run_stock_worker(resources, record)
    assert seen == ["in_progress", "in_progress"]
    assert await job_state(redis, settings, running, "default-queue") == "absent"
