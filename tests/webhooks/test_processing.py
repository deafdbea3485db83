"""One processing attempt: counted durably, errors survive the handler's rollback, one worker at a time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import func, select, text

from app.core.module import FeatureModule
from app.core.resources import Resources
from app.core.settings import Settings
from app.queue.errors import RetryLater
from app.queue.models import CronRun, JobOutbox
from app.runtime import open_resources
from app.webhooks.handlers import WebhookContext
from app.webhooks.inbox import Inbox, event_lock_key
from app.webhooks.inbox.sql import MARK_PROCESSED_AND_UNLOCK
from app.webhooks.models import WebhookEvent
from app.webhooks.processing import process_event
from tests.queue.sample_jobs import RecordData, RecordJob
from tests.webhooks.conftest import kill_pooled_connection

_ADVISORY_LOCKS_HELD = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


async def stored_row(resources: Resources, event_id: str = "evt_processing") -> int:
    body = f'{{"id": "{event_id}", "type": "customer.subscription.updated"}}'
    stored = await Inbox(resources.db).store("stripe", event_id, "customer.subscription.updated", body)
    return stored.row_id


async def load(resources: Resources, row_id: int) -> WebhookEvent:
    async with resources.db.session() as session:
        row = await session.get(WebhookEvent, row_id)
        assert row is not None
        return row


async def assert_one_failed_attempt_and_no_lock(resources: Resources, row_id: int, error: str) -> None:
    row = await load(resources, row_id)
    assert row.processed_at is None and row.attempts == 1
    assert row.last_error is not None and error in row.last_error
    async with resources.db.session() as session:
        assert await session.scalar(text(_ADVISORY_LOCKS_HELD)) == 0


@pytest.fixture
async def make_resources(settings: Settings) -> Any:
    opened: list[Resources] = []

    def make(handler: Any) -> Resources:
        module = FeatureModule(name="test-handlers", webhook_handlers={"stripe": handler})
        resources = open_resources(settings, [module])
        opened.append(resources)
        return resources

    yield make
    for resources in opened:
        await resources.close()


async def test_success_marks_processed_and_counts_one_attempt(make_resources: Any) -> None:
    calls: list[str] = []

    async def handler(context: WebhookContext) -> None:
        calls.append(context.event.event_id)

    resources = make_resources(handler)
    row_id = await stored_row(resources)
    await process_event(resources, row_id)
    row = await load(resources, row_id)
    assert row.processed_at is not None
    assert (row.attempts, row.last_error) == (1, None)
    await process_event(resources, row_id)  # a processed event is skipped
    assert calls == ["evt_processing"]
    assert (await load(resources, row_id)).attempts == 1


async def test_failure_keeps_attempt_and_error_but_rolls_back_the_handler_work(make_resources: Any) -> None:
    async def handler(context: WebhookContext) -> None:
        context.session.add(CronRun(name="written-by-failing-handler", slot=func.now()))
        await context.session.flush()
        raise RuntimeError("Stripe said no")

    resources = make_resources(handler)
    row_id = await stored_row(resources)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="Stripe said no"):
            await process_event(resources, row_id)
    row = await load(resources, row_id)
    assert row.processed_at is None
    assert row.attempts == 2
    assert row.last_error == "RuntimeError: Stripe said no"
    async with resources.db.session() as session:
        assert await session.scalar(select(func.count()).select_from(CronRun)) == 0


async def test_a_write_the_handler_left_unflushed_commits_with_the_mark(make_resources: Any) -> None:
    """The mark runs on the claiming connection, beside the session: the session's pending writes go first."""

    async def handler(context: WebhookContext) -> None:
        context.session.add(CronRun(name="left-pending-by-the-handler", slot=func.now()))  # no flush

    resources = make_resources(handler)
    row_id = await stored_row(resources)
    await process_event(resources, row_id)
    assert (await load(resources, row_id)).processed_at is not None
    async with resources.db.session() as session:
        names = (await session.scalars(select(CronRun.name))).all()
    assert names == ["left-pending-by-the-handler"]


async def test_an_unflushed_write_that_fails_leaves_the_event_unprocessed_and_unlocked(make_resources: Any) -> None:
    async def handler(context: WebhookContext) -> None:
        context.session.add(CronRun(name=None, slot=func.now()))  # NOT NULL: fails when flushed, before the mark

    resources = make_resources(handler)
    row_id = await stored_row(resources)
    with pytest.raises(Exception, match="null value"):
        await process_event(resources, row_id)
    await assert_one_failed_attempt_and_no_lock(resources, row_id, "IntegrityError")
    async with resources.db.session() as session:
        assert await session.scalar(select(func.count()).select_from(CronRun)) == 0


async def test_a_later_success_clears_the_last_error(make_resources: Any) -> None:
    state = {"fail": True}

    async def handler(context: WebhookContext) -> None:
        if state["fail"]:
            raise ValueError("temporary")

    resources = make_resources(handler)
    row_id = await stored_row(resources)
    with pytest.raises(ValueError):
        await process_event(resources, row_id)
    state["fail"] = False
    await process_event(resources, row_id)
    row = await load(resources, row_id)
    assert row.processed_at is not None and row.last_error is None and row.attempts == 2


async def test_an_attempt_asked_to_come_back_later_is_given_back_and_records_no_error(make_resources: Any) -> None:
    state = {"later": 2}

    async def handler(context: WebhookContext) -> None:
        if state["later"]:
            state["later"] -= 1
            context.session.add(CronRun(name="written-before-the-429", slot=func.now()))
            await context.session.flush()
            raise RetryLater("Stripe answered 429", after_seconds=30)

    resources = make_resources(handler)
    row_id = await stored_row(resources)
    for _ in range(2):
        with pytest.raises(RetryLater):
            await process_event(resources, row_id)
        row = await load(resources, row_id)
        assert (row.attempts, row.last_error, row.processed_at) == (0, None, None)
    async with resources.db.session() as session:
        assert await session.scalar(text(_ADVISORY_LOCKS_HELD)) == 0
        assert await session.scalar(select(func.count()).select_from(CronRun)) == 0  # the handler's work rolled back
    await process_event(resources, row_id)
    row = await load(resources, row_id)
    assert row.processed_at is not None and (row.attempts, row.last_error) == (1, None)


async def test_two_workers_never_process_one_event_at_the_same_time(make_resources: Any) -> None:
    running = 0
    overlaps = 0
    calls = 0

    async def handler(context: WebhookContext) -> None:
        nonlocal running, overlaps, calls
        calls += 1
        running += 1
        overlaps += running > 1
        await asyncio.sleep(0.3)
        running -= 1

    first, second = make_resources(handler), make_resources(handler)  # two pools, like two workers
    row_id = await stored_row(first)
    await asyncio.gather(process_event(first, row_id), process_event(second, row_id), process_event(first, row_id))
    assert (calls, overlaps) == (1, 0)
    row = await load(first, row_id)
    assert row.processed_at is not None and row.attempts == 1


async def test_set_aside_event_is_not_processed(make_resources: Any) -> None:
    calls: list[int] = []

    async def handler(context: WebhookContext) -> None:
        calls.append(context.event.id)

    resources = make_resources(handler)
    row_id = await stored_row(resources)
    async with resources.db.session() as session:
        await session.execute(text("UPDATE webhook_event SET abandoned_at = now() WHERE id = :id"), {"id": row_id})
        await session.commit()
    await process_event(resources, row_id)
    assert calls == []
    assert (await load(resources, row_id)).attempts == 0


async def test_lock_is_released_after_a_failure(make_resources: Any) -> None:
    async def failing(context: WebhookContext) -> None:
        raise RuntimeError("boom")

    resources = make_resources(failing)
    row_id = await stored_row(resources)
    with pytest.raises(RuntimeError):
        await process_event(resources, row_id)
    async with resources.db.session() as session:
        held = await session.scalar(text(_ADVISORY_LOCKS_HELD))
    assert held == 0


async def test_a_bookkeeping_connection_that_died_is_dropped_so_the_retry_processes(make_resources: Any) -> None:
    """A worker's pool after a Postgres restart: the dead connection fails one try, the retry gets a live one."""
    handled: list[str] = []

    async def handler(context: WebhookContext) -> None:
        handled.append(context.event.event_id)

    resources = make_resources(handler)
    row_id = await stored_row(resources)
    await kill_pooled_connection(resources)
    with pytest.raises(Exception, match="closed"):
        await process_event(resources, row_id)
    await process_event(resources, row_id)
    assert handled == ["evt_processing"]
    assert (await load(resources, row_id)).processed_at is not None


async def test_a_claim_between_the_early_unlock_and_the_commit_waits_and_finds_the_event_processed(
    make_resources: Any,
) -> None:
    """Success releases the lock before COMMIT, in the statement that sets processed_at: a second worker
    claiming in that window must wait for the row and then skip the event, not process it again."""
    calls: list[str] = []

    async def handler(context: WebhookContext) -> None:
        calls.append(context.event.event_id)

    first, second = make_resources(handler), make_resources(handler)
    row_id = await stored_row(first)
    async with first.db.engine.connect() as connection:
        driver = (await connection.get_raw_connection()).driver_connection
        assert await driver.fetchval("SELECT pg_try_advisory_lock($1)", event_lock_key(row_id))
        transaction = driver.transaction()
        await transaction.start()
        await driver.fetchval(MARK_PROCESSED_AND_UNLOCK, row_id, event_lock_key(row_id))
        competing = asyncio.create_task(process_event(second, row_id))
        await asyncio.sleep(0.3)
        assert not competing.done()  # waiting on the row, not processing it
        await transaction.commit()
    await asyncio.wait_for(competing, 5)
    assert calls == []
    row = await load(first, row_id)
    assert row.processed_at is not None and row.attempts == 0


async def test_a_commit_that_fails_after_the_early_unlock_records_the_error_and_leaves_no_lock(
    make_resources: Any,
) -> None:
    async def handler(context: WebhookContext) -> None:
        # A deferred constraint fails at COMMIT, after processed_at was set and the lock released.
        await context.session.execute(
            text("CREATE TEMP TABLE once (id int UNIQUE DEFERRABLE INITIALLY DEFERRED) ON COMMIT DROP")
        )
        await context.session.execute(text("INSERT INTO once VALUES (1), (1)"))

    resources = make_resources(handler)
    row_id = await stored_row(resources)
    with pytest.raises(Exception, match="duplicate key"):
        await process_event(resources, row_id)
    await assert_one_failed_attempt_and_no_lock(resources, row_id, "duplicate key")


async def _staged_job_ids(resources: Resources) -> list[str]:
    async with resources.db.session() as session:
        return list((await session.scalars(select(JobOutbox.job_id))).all())


async def test_a_job_the_handler_stages_is_queued_right_after_the_commit(make_resources: Any) -> None:
    async def handler(context: WebhookContext) -> None:
        await context.queue(RecordJob, RecordData(key=context.event.event_id), deduplication_id="follow-up")

    resources = make_resources(handler)
    await process_event(resources, await stored_row(resources))

    assert await resources.queue.state("follow-up", "default-queue") == "queued"
    assert await _staged_job_ids(resources) == []


async def test_a_job_staged_by_a_failing_handler_is_never_queued(make_resources: Any) -> None:
    async def handler(context: WebhookContext) -> None:
        await context.queue(RecordJob, RecordData(key=context.event.event_id), deduplication_id="follow-up")
        await context.session.flush()
        raise RuntimeError("Stripe said no")

    resources = make_resources(handler)
    with pytest.raises(RuntimeError, match="Stripe said no"):
        await process_event(resources, await stored_row(resources))

    assert await _staged_job_ids(resources) == []
    assert await resources.queue.relay_outbox() == 0
    assert await resources.queue.state("follow-up", "default-queue") == "absent"
