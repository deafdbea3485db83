"""The pipeline with a real worker process: failures go through retries and recovery rounds, are set
aside with exactly one alert, and retry-abandoned brings them back once the handler works."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from sqlalchemy import text

from app.core.resources import Resources
from app.core.sentry import flush_sentry, init_sentry
from app.core.settings import load_settings
from app.runtime import open_resources
from app.testing.processes import child_env
from app.webhooks.inbox import Inbox
from app.webhooks.jobs import queue_processing
from app.webhooks.maintenance import recover
from app.webhooks.models import WebhookEvent
from tests.processes import ROOT, wait_for, worker_starter
from tests.stubs.sentry_ingest import SentryIngestStub, exception_types
from tests.webhooks.worker_handlers import CREATE_TABLE, EMPTY_TABLE, PROVIDER, failing_key

FAST_RETRIES = {
    "WEBHOOK_RETRY_LIMIT": "2",
    "WEBHOOK_RETRY_BASE_SECONDS": "0.05",
    "WEBHOOK_ABANDON_AFTER_ATTEMPTS": "6",
    "WEBHOOK_RECOVERY_AFTER_SECONDS": "0",
}


@pytest.fixture
async def start_worker(settings_env: dict[str, str]) -> AsyncIterator[Callable[..., Any]]:
    module = "tests.webhooks.worker_handlers:MODULE"
    async with worker_starter(settings_env, "--module", module, "--queues", "webhook-queue") as start:
        yield start


async def row_of(resources: Resources, row_id: int) -> WebhookEvent:
    async with resources.db.session() as session:
        row = await session.get(WebhookEvent, row_id)
        assert row is not None
        return row


async def successes(resources: Resources) -> int:
    async with resources.db.session() as session:
        return int(await session.scalar(text("SELECT count(*) FROM webhook_test_success")) or 0)


def retry_abandoned(env: dict[str, str]) -> str:
    litestar = os.path.join(os.path.dirname(sys.executable), "litestar")
    result = subprocess.run(
        [litestar, "--app", "app.asgi:create_app", "webhooks", "retry-abandoned"],
        cwd=ROOT,
        env=child_env(env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


async def empty_effects_table(resources: Resources) -> None:
    async with resources.db.session() as session:
        await session.execute(text(CREATE_TABLE))
        await session.execute(text(EMPTY_TABLE))
        await session.commit()


@pytest.mark.slow
async def test_failing_event_is_set_aside_once_then_reopened_and_processed(
    settings_env: dict[str, str], start_worker: Any, sentry_stub: SentryIngestStub
) -> None:
    env = {**settings_env, **FAST_RETRIES, "SENTRY_DSN": sentry_stub.dsn}
    resources = open_resources(load_settings(env), ())
    try:
        await empty_effects_table(resources)
        init_sentry(resources.settings, "worker")  # the recovery rounds below run in this process
        await resources.redis.set(failing_key(resources.settings.redis_namespace), 1)
        await start_worker(**FAST_RETRIES, SENTRY_DSN=sentry_stub.dsn)
        stored = await Inbox(resources.db).store(PROVIDER, "evt_always_fails", "thing.happened", '{"a": 1}')
        row_id = stored.row_id

        async def settled_at(attempts: int) -> bool:
            row = await row_of(resources, row_id)
            return (
                row.attempts == attempts
                and await resources.queue.state(f"webhook-event:{row_id}", "webhook-queue") == "absent"
            )

        assert await queue_processing(resources.queue, PROVIDER, row_id)
        await wait_for(lambda: settled_at(3), 20, "the first round: 1 try + 2 retries")
        assert (await recover(resources)).requeued == 1
        await wait_for(lambda: settled_at(6), 20, "the second round")
        set_aside = await recover(resources)
        again = await recover(resources)
        assert (set_aside.set_aside, set_aside.requeued, again.set_aside, again.requeued) == (1, 0, 0, 0)
        row = await row_of(resources, row_id)
        assert row.abandoned_at is not None and row.processed_at is None
        assert row.last_error == "RuntimeError: test handler failing for evt_always_fails"

        flush_sentry()
        events = sentry_stub.wait_for(lambda items: len(items) >= 7, timeout=10)
        alerts = [event for event in events if "exception" not in event]
        failures = [event for event in events if "exception" in event]
        assert len(alerts) == 1 and alerts[0]["level"] == "error"
        assert len(failures) == 6 and {tuple(exception_types(e)) for e in failures} == {("RuntimeError",)}

        await resources.redis.delete(failing_key(resources.settings.redis_namespace))
        assert retry_abandoned(env) == "Reopened 1 webhook event."
        await wait_for(lambda: successes(resources), 20, "the reopened event to be processed")
        row = await row_of(resources, row_id)
        assert row.processed_at is not None and row.abandoned_at is None and row.attempts == 1
        assert retry_abandoned(env) == "Reopened 0 webhook events."
        assert await successes(resources) == 1
    finally:
        import sentry_sdk

        sentry_sdk.init(dsn=None, auto_enabling_integrations=False)  # auto-enabled ones would patch Litestar
        await resources.close()


@pytest.mark.slow
async def test_fifty_queued_copies_of_one_event_process_it_once(
    settings_env: dict[str, str], start_worker: Any
) -> None:
    resources = open_resources(load_settings(settings_env), ())
    try:
        await empty_effects_table(resources)
        stored = await Inbox(resources.db).store(PROVIDER, "evt_many_copies", "thing.happened", "{}")
        # Recovery, redeliveries and operators may all queue it; arq's dedup and the row lock keep it to one run.
        await asyncio.gather(*(queue_processing(resources.queue, PROVIDER, stored.row_id) for _ in range(50)))
        await start_worker()
        await wait_for(lambda: successes(resources), 20, "the event to be processed")
        await asyncio.sleep(0.5)
        assert await successes(resources) == 1
        assert (await row_of(resources, stored.row_id)).attempts == 1
    finally:
        await resources.close()
