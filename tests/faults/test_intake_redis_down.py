"""Redis down at intake: 200 and the row stored; once Redis is back the recovery cron gets it processed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from app.asgi import build_app
from app.core.module import FeatureModule
from app.core.resources import Resources
from app.core.settings import load_settings
from app.runtime import open_resources
from app.system import module as system
from app.testing.deliveries import clerk_event, signed_clerk_delivery
from app.webhooks.handlers import WebhookContext
from app.webhooks.maintenance import recover
from app.webhooks.module import build_webhooks_module
from app.webhooks.processing import process_event
from tests.stubs.redis_server import RedisServer
from tests.webhooks.conftest import inbox_rows


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.kill()


async def test_intake_with_redis_down_stores_and_recovery_processes_later(
    settings_env: dict[str, str], own_redis: RedisServer, webhook_secrets: dict[str, str]
) -> None:
    handled: list[str] = []

    async def handle(context: WebhookContext) -> None:
        handled.append(context.event.event_id)

    recording = FeatureModule(name="recording", webhook_handlers={"clerk": handle})
    settings = load_settings({**settings_env, "REDIS_URL": own_redis.url, "WEBHOOK_RECOVERY_AFTER_SECONDS": "0"})
    modules = [system.MODULE, build_webhooks_module(), recording]
    delivery = signed_clerk_delivery(clerk_event("user.updated"), webhook_secrets["clerk"])
    async with AsyncTestClient(build_app(settings, modules)) as client:
        own_redis.kill()
        started = time.monotonic()
        response = await client.post("/webhooks/clerk", content=delivery.body, headers=delivery.headers)
        elapsed = time.monotonic() - started
    assert response.status_code == 200
    assert elapsed < 3.0  # bounded: the limiter fails open, the enqueue gives up within about a second

    own_redis.start()  # back, empty: the job was never queued
    resources = open_resources(settings, [recording])
    try:
        (row,) = await inbox_rows(resources)
        assert row.processed_at is None
        report = await recover(resources, now=datetime.now(UTC) + timedelta(seconds=1))
        assert report.requeued == 1
        await run_queued_webhook_jobs(resources)
        (row,) = await inbox_rows(resources)
    finally:
        await resources.close()
    assert row.processed_at is not None
    assert handled == [delivery.event_id]


async def run_queued_webhook_jobs(resources: Resources) -> Any:
    """What a worker does with the queued job (the worker itself is tested with real processes elsewhere)."""
    namespace = resources.settings.redis_namespace
    job_ids = await resources.redis.zrange(f"{namespace}webhook-clerk-queue", 0, -1)
    assert job_ids, "the recovery cron queued nothing"
    rows = await inbox_rows(resources)
    for row in rows:
        await process_event(resources, row.id)
