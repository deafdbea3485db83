"""A handler module a real worker loads in tests (``--module tests.webhooks.worker_handlers:MODULE``).

It fails while the Redis key ``<namespace>test:failing`` exists, and records each
success in ``webhook_test_success`` inside the pipeline's transaction: a row
there means an effect that committed with the event's ``processed_at``. While
``<namespace>test:hold`` exists it waits, after its insert, inside that
transaction (it sets ``<namespace>test:holding`` first), so a test can freeze a
worker mid-attempt.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import text

from app.core.module import FeatureModule
from app.webhooks.handlers import WebhookContext

PROVIDER = "test-worker"
CREATE_TABLE = "CREATE TABLE IF NOT EXISTS webhook_test_success (event_id text NOT NULL, at timestamptz DEFAULT now())"
EMPTY_TABLE = "TRUNCATE webhook_test_success"


def failing_key(namespace: str) -> str:
    return f"{namespace}test:failing"


def hold_key(namespace: str) -> str:
    return f"{namespace}test:hold"


def holding_key(namespace: str) -> str:
    return f"{namespace}test:holding"


async def handle(context: WebhookContext) -> None:
    if await context.resources.redis.exists(failing_key(context.resources.settings.redis_namespace)):
        raise RuntimeError(f"test handler failing for {context.event.event_id}")
    await context.session.execute(
        text("INSERT INTO webhook_test_success (event_id) VALUES (:event_id)"), {"event_id": context.event.event_id}
    )
    redis, namespace = context.resources.redis, context.resources.settings.redis_namespace
    if await redis.exists(hold_key(namespace)):
        await redis.set(holding_key(namespace), "1")
        while await redis.exists(hold_key(namespace)):  # noqa: ASYNC110 - released by another process, via Redis
            await asyncio.sleep(0.1)


MODULE = FeatureModule(name="webhook-test-handlers", webhook_handlers={PROVIDER: handle})
