"""``webhook_pipeline_seconds`` (and the overview's latency) measure an event's first way through the pipeline:
a replay of an old event would otherwise be an hour-long observation, skew the p99 and fire WebhookPipelineSlow.
A set-aside event reopened and processed did wait that long: it counts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import update

from app.core.module import FeatureModule
from app.core.resources import Resources
from app.core.settings import Settings
from app.runtime import open_resources
from app.webhooks import operations
from app.webhooks.handlers import WebhookContext
from app.webhooks.inbox import Inbox
from app.webhooks.models import WebhookEvent
from app.webhooks.processing import process_event


async def _applied(context: WebhookContext) -> None:
    return None


@pytest.fixture
async def pipeline(settings: Settings) -> AsyncIterator[Resources]:
    resources = open_resources(settings, [FeatureModule(name="latency", webhook_handlers={"stripe": _applied})])
    yield resources
    await resources.close()


def observed() -> tuple[float, float]:
    """The histogram's count and sum for stripe, in this process."""
    labels = {"provider": "stripe"}
    count = REGISTRY.get_sample_value("webhook_pipeline_seconds_count", labels) or 0.0
    return count, REGISTRY.get_sample_value("webhook_pipeline_seconds_sum", labels) or 0.0


async def _stored_an_hour_ago(resources: Resources, event_id: str, **fields: object) -> int:
    stored = await Inbox(resources.db).store("stripe", event_id, "invoice.paid", f'{{"id": "{event_id}"}}')
    async with resources.db.session() as session:
        hour_ago = datetime.now(UTC) - timedelta(hours=1)
        await session.execute(
            update(WebhookEvent).where(WebhookEvent.id == stored.row_id).values(received_at=hour_ago, **fields)
        )
        await session.commit()
    return stored.row_id


async def test_an_event_is_measured_when_first_processed_not_when_replayed(pipeline: Resources) -> None:
    row_id = await _stored_an_hour_ago(pipeline, "evt_latency_1")
    count, total = observed()

    await process_event(pipeline, row_id)
    first_count, first_total = observed()
    assert first_count == count + 1 and 3590 < first_total - total < 3700

    await operations.replay(pipeline, str(row_id))
    await process_event(pipeline, row_id)

    replayed = await Inbox(pipeline.db).get(row_id)
    assert replayed is not None and replayed.processed_at is not None and replayed.replayed_at is not None
    assert observed() == (first_count, first_total)
    assert "stripe" not in await Inbox(pipeline.db).latency_last_hour()  # the overview leaves it out too


async def test_a_set_aside_event_reopened_and_processed_is_measured_with_its_whole_wait(pipeline: Resources) -> None:
    row_id = await _stored_an_hour_ago(
        pipeline, "evt_latency_2", attempts=33, abandoned_at=datetime.now(UTC), last_error="RuntimeError: down"
    )
    count, total = observed()

    outcome = await operations.retry(pipeline, str(row_id))
    await process_event(pipeline, row_id)

    assert outcome.message.startswith("Reopened and queued")
    new_count, new_total = observed()
    assert new_count == count + 1 and 3590 < new_total - total < 3700
    (n, p50, _), *_ = (await Inbox(pipeline.db).latency_last_hour()).values()
    assert n == 1 and 3590 < p50 < 3700
