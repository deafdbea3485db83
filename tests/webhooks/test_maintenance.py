"""Recovery, set-aside alerts, retention and reopening, on real Postgres and Redis."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select, text

from app.core.resources import Resources
from app.core.settings import load_settings
from app.runtime import open_resources
from app.webhooks import maintenance, operations
from app.webhooks.inbox import Inbox, SetAside, upkeep
from app.webhooks.jobs import ProcessWebhookEventData, deduplication_id, processing_job
from app.webhooks.maintenance import delete_old_processed, recover, reopen_abandoned
from app.webhooks.models import WebhookEvent
from tests.stubs.sentry_ingest import SentryIngestStub

NOW = datetime.now(UTC)


async def add_event(
    resources: Resources,
    event_id: str,
    *,
    age: timedelta = timedelta(0),
    attempts: int = 0,
    processed_age: timedelta | None = None,
    abandoned: bool = False,
    subject: str | None = None,
) -> int:
    body = f'{{"id": "{event_id}", "type": "invoice.paid"}}'
    stored = await Inbox(resources.db).store("stripe", event_id, "invoice.paid", body, sync_subject=subject)
    async with resources.db.session() as session:
        await session.execute(
            text(
                "UPDATE webhook_event SET received_at = :received, attempts = :attempts, last_error = :error, "
                "processed_at = :processed, abandoned_at = :abandoned WHERE id = :id"
            ),
            {
                "id": stored.row_id,
                "received": NOW - age,
                "attempts": attempts,
                "error": "RuntimeError: Stripe is down" if attempts else None,
                "processed": NOW - processed_age if processed_age is not None else None,
                "abandoned": NOW if abandoned else None,
            },
        )
        await session.commit()
    return stored.row_id


async def job_state(resources: Resources, row_id: int, suffix: str = "") -> str:
    return await resources.queue.state(deduplication_id(row_id) + suffix, "webhook-stripe-queue")


async def test_recovery_requeues_only_stuck_pending_events(resources: Resources) -> None:
    stuck = await add_event(resources, "evt_stuck", age=timedelta(minutes=20), attempts=3)
    fresh = await add_event(resources, "evt_fresh", age=timedelta(minutes=1))
    done = await add_event(resources, "evt_done", age=timedelta(hours=2), processed_age=timedelta(hours=1))
    aside = await add_event(resources, "evt_aside", age=timedelta(hours=2), attempts=40, abandoned=True)

    report = await recover(resources)
    assert (report.requeued, report.already_queued, report.set_aside) == (1, 0, 0)
    assert await job_state(resources, stuck) == "queued"
    for row_id in (fresh, done, aside):
        assert await job_state(resources, row_id) == "absent"

    again = await recover(resources)  # its job still waits: not queued twice
    assert (again.requeued, again.already_queued) == (0, 1)


async def test_recovery_pages_through_a_large_backlog(resources: Resources, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(maintenance, "RECOVERY_PAGE_SIZE", 3)
    rows = [await add_event(resources, f"evt_backlog_{i}", age=timedelta(minutes=30 + i)) for i in range(8)]
    report = await recover(resources)
    assert report.requeued == 8
    assert {await job_state(resources, row_id) for row_id in rows} == {"queued"}


async def test_recovery_queues_the_newest_event_of_each_synced_subject_for_all_of_them(
    resources: Resources, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A synced event's job asks for a sync covering every event of its subject that arrived by then: during a
    Stripe outage a tick costs one job per customer, not one per event (across its pages, too)."""
    monkeypatch.setattr(maintenance, "RECOVERY_PAGE_SIZE", 2)
    ones = [
        await add_event(resources, f"evt_one_{n}", age=timedelta(minutes=40 - n), subject="customer:cus_1")
        for n in range(3)
    ]
    other = await add_event(resources, "evt_other", age=timedelta(minutes=30), subject="customer:cus_2")
    unsynced = [await add_event(resources, f"evt_alone_{n}", age=timedelta(minutes=30)) for n in range(2)]

    report = await recover(resources)
    assert report.requeued == 4
    assert [await job_state(resources, row_id) for row_id in ones] == ["absent", "absent", "queued"]
    assert {await job_state(resources, row_id) for row_id in [other, *unsynced]} == {"queued"}


async def test_exhausted_event_is_set_aside_with_exactly_one_alert(
    settings_env: dict[str, str], sentry_enabled: SentryIngestStub
) -> None:
    from app.core.sentry import init_sentry

    settings = load_settings({**settings_env, "SENTRY_DSN": sentry_enabled.dsn})
    init_sentry(settings, "worker")
    resources = open_resources(settings, ())
    try:
        row_id = await add_event(resources, "evt_exhausted", age=timedelta(hours=2), attempts=33)
        first = await recover(resources)
        second = await recover(resources)
        async with resources.db.session() as session:
            row = await session.get(WebhookEvent, row_id)
            assert row is not None and row.abandoned_at is not None
    finally:
        await resources.close()
    assert (first.set_aside, second.set_aside, first.requeued) == (1, 0, 0)
    import sentry_sdk

    sentry_sdk.flush(timeout=5)
    events = sentry_enabled.wait_for(lambda items: len(items) >= 1)
    assert len(events) == 1
    (alert,) = events
    assert alert["level"] == "error"
    assert "exception" not in alert
    message = alert.get("logentry", {}).get("message") or alert.get("message", "")
    for expected in ("stripe", "evt_exhausted", "invoice.paid", "33 attempts", "Stripe is down"):
        assert expected in message


async def test_a_tick_that_dies_before_committing_its_set_aside_alerts_again_on_the_next_tick(
    resources: Resources, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The set-aside commits only after its alert went out: a crash in between repeats the alert, never loses it."""
    row_id = await add_event(resources, "evt_alert_crash", age=timedelta(hours=2), attempts=33)
    alerted: list[str] = []

    def dies_after_alerting(event: SetAside) -> None:
        alerted.append(event.event_id)
        raise SystemExit("the worker died right after alerting")

    monkeypatch.setattr(maintenance, "alert_set_aside", dies_after_alerting)
    with pytest.raises(SystemExit):
        await recover(resources)
    async with resources.db.session() as session:
        row = await session.get(WebhookEvent, row_id)
        assert row is not None and row.abandoned_at is None  # rolled back: still due for a set-aside

    monkeypatch.setattr(maintenance, "alert_set_aside", lambda event: alerted.append(event.event_id))
    assert (await recover(resources)).set_aside == 1
    assert (await recover(resources)).set_aside == 0
    assert alerted == ["evt_alert_crash", "evt_alert_crash"]


async def test_retention_deletes_only_old_processed_events_in_batches(
    resources: Resources, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(maintenance, "RETENTION_BATCH_SIZE", 2)
    old = [
        await add_event(resources, f"evt_old_{i}", age=timedelta(days=40), processed_age=timedelta(days=31))
        for i in range(5)
    ]
    recent = await add_event(resources, "evt_recent", age=timedelta(days=2), processed_age=timedelta(days=1))
    old_pending = await add_event(resources, "evt_old_pending", age=timedelta(days=60), attempts=2)
    old_aside = await add_event(resources, "evt_old_aside", age=timedelta(days=60), attempts=33, abandoned=True)

    statements: list[str] = []
    original = upkeep.driver_connection

    def counting(db: Any) -> Any:
        statements.append("batch")
        return original(db)

    monkeypatch.setattr(upkeep, "driver_connection", counting)
    assert await delete_old_processed(resources) == 5
    assert len(statements) == 3  # batches of 2, 2 and 1: each its own short transaction
    async with resources.db.session() as session:
        left = set((await session.scalars(select(WebhookEvent.id))).all())
    assert left == {recent, old_pending, old_aside}
    assert not set(old) & left


async def test_reopen_gives_set_aside_events_their_attempts_back(resources: Resources) -> None:
    aside = await add_event(resources, "evt_reopen", age=timedelta(hours=3), attempts=33, abandoned=True)
    assert await reopen_abandoned(resources) == [aside]
    assert await reopen_abandoned(resources) == []
    async with resources.db.session() as session:
        row = await session.get(WebhookEvent, aside)
        assert row is not None
        assert (row.abandoned_at, row.attempts) == (None, 0)
    assert await job_state(resources, aside) == "queued"


async def test_an_operators_retry_runs_a_retry_waiting_out_its_backoff_now(resources: Resources) -> None:
    """arq has no public way to move a waiting job's time: one more run is queued now, beside it."""
    row_id = await add_event(resources, "evt_backoff", attempts=2)
    await resources.queue.add(
        processing_job("stripe"),
        ProcessWebhookEventData(event_row_id=row_id),
        deduplication_id=deduplication_id(row_id),
        delay=timedelta(hours=1),
    )
    assert await job_state(resources, row_id) == "deferred"

    outcome = await operations.retry(resources, str(row_id))

    assert (
        outcome.message
        == f"Queued stripe event evt_backoff (row {row_id}) to run now (its waiting retry then finds it done)."
    )
    assert await job_state(resources, row_id, ":operator") == "queued"
    assert await job_state(resources, row_id) == "deferred"  # left as it was: arq's scores are arq's
    again = await operations.retry(resources, str(row_id))  # still one run now
    assert again.message == f"Already queued: stripe event evt_backoff (row {row_id})."
