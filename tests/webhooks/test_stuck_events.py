"""No event can get stuck: every path out of a claim frees its lock and records why; permanent failures are
set aside at once with their one alert; a set-aside never races a running attempt."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import text

from app.core.db import driver_connection
from app.core.module import FeatureModule
from app.core.resources import Resources
from app.core.settings import Settings, load_settings
from app.queue.errors import PermanentError
from app.runtime import open_resources
from app.webhooks.handlers import WebhookContext
from app.webhooks.maintenance import recover
from app.webhooks.processing import process_event
from tests.stubs.sentry_ingest import SentryIngestStub

ADVISORY_LOCKS_HELD = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


async def insert_raw(resources: Resources, event_id: str, payload_sql: str, *, attempts: int = 0) -> int:
    """A row as an older intake could have stored it, bypassing today's intake rules."""
    async with driver_connection(resources.db) as connection:
        return int(
            await connection.fetchval(
                "INSERT INTO webhook_event (provider, event_id, type, payload, attempts, received_at) "
                f"VALUES ('stripe', $1, 'invoice.paid', {payload_sql}, $2, now() - interval '2 hours') RETURNING id",
                event_id,
                attempts,
            )
        )


async def row(resources: Resources, row_id: int) -> Any:
    """The row's state, without its payload (which the ORM could not read for the unreadable one)."""
    async with driver_connection(resources.db) as connection:
        return await connection.fetchrow(
            "SELECT attempts, processed_at, abandoned_at, last_error FROM webhook_event WHERE id = $1", row_id
        )


async def locks_held(resources: Resources) -> int:
    async with driver_connection(resources.db) as connection:
        return int(await connection.fetchval(ADVISORY_LOCKS_HELD))


def with_handler(settings: Settings, handler: Any) -> Resources:
    return open_resources(settings, [FeatureModule(name="h", webhook_handlers={"stripe": handler})])


def alerts(stub: SentryIngestStub) -> list[dict[str, Any]]:
    import sentry_sdk

    sentry_sdk.flush(timeout=5)
    return [event for event in stub.events if "exception" not in event]


async def test_a_stored_payload_the_worker_cannot_read_is_set_aside_with_its_error_and_one_alert(
    settings_env: dict[str, str], sentry_enabled: SentryIngestStub
) -> None:
    """It sat "being processed by another worker" forever: the claim raised with the lock taken."""
    from app.core.sentry import init_sentry

    settings = load_settings({**settings_env, "SENTRY_DSN": sentry_enabled.dsn})
    init_sentry(settings, "worker")
    handled: list[str] = []

    async def handler(context: WebhookContext) -> None:
        handled.append(context.event.event_id)

    resources = with_handler(settings, handler)
    try:
        row_id = await insert_raw(resources, "evt_unreadable", """('{"n": 1e5000}')::jsonb""")
        with pytest.raises(PermanentError, match="cannot be read"):
            await process_event(resources, row_id)
        stored = await row(resources, row_id)
        assert stored["abandoned_at"] is not None and stored["processed_at"] is None
        assert stored["last_error"] and "cannot be read" in stored["last_error"]
        assert await locks_held(resources) == 0
        await process_event(resources, row_id)  # set aside: nothing to do, and no lock left behind
        assert await locks_held(resources) == 0
        assert (await recover(resources)).requeued == 0
    finally:
        await resources.close()
    assert handled == []
    (alert,) = alerts(sentry_enabled)
    assert "evt_unreadable" in (alert.get("logentry", {}).get("message") or alert.get("message", ""))


async def test_a_permanent_error_sets_the_event_aside_at_once(settings: Settings) -> None:
    async def handler(context: WebhookContext) -> None:
        raise PermanentError("Stripe answered 404 for customer cus_gone")

    resources = with_handler(settings, handler)
    try:
        row_id = await insert_raw(resources, "evt_permanent", """'{"id": "evt_permanent"}'::jsonb""")
        with pytest.raises(PermanentError):
            await process_event(resources, row_id)
        stored = await row(resources, row_id)
        assert (stored["attempts"], stored["abandoned_at"] is not None) == (1, True)
        assert stored["last_error"] == "PermanentError: Stripe answered 404 for customer cus_gone"
        report = await recover(resources)
        assert (report.requeued, report.set_aside) == (0, 0)  # not re-queued every 10 minutes until 33 attempts
    finally:
        await resources.close()


async def test_setting_an_event_aside_waits_for_a_running_attempt_instead_of_racing_it(settings: Settings) -> None:
    """An event is never both processed and set aside (and never alerted about falsely)."""
    started, finish = asyncio.Event(), asyncio.Event()

    async def handler(context: WebhookContext) -> None:
        started.set()
        await finish.wait()

    resources = with_handler(settings, handler)
    try:
        row_id = await insert_raw(resources, "evt_race", """'{"id": "evt_race"}'::jsonb""", attempts=40)
        attempt = asyncio.create_task(process_event(resources, row_id))
        await started.wait()
        during = await recover(resources)
        finish.set()
        await attempt
        stored = await row(resources, row_id)
        after = await recover(resources)
    finally:
        await resources.close()
    assert during.set_aside == 0 and after.set_aside == 0
    assert stored["processed_at"] is not None and stored["abandoned_at"] is None


async def test_a_claim_that_fails_mid_statement_drops_its_connection_and_lock(settings: Settings) -> None:
    """Cancelled (a job timeout) while the claim runs: the lock may be held, so the connection must go."""
    resources = with_handler(settings, lambda context: asyncio.sleep(0))
    try:
        row_id = await insert_raw(resources, "evt_cancelled_claim", """'{"id": "x"}'::jsonb""")
        async with driver_connection(resources.db) as blocker:
            await blocker.execute("BEGIN")
            await blocker.execute("SELECT 1 FROM webhook_event WHERE id = $1 FOR UPDATE", row_id)
            claim = asyncio.create_task(process_event(resources, row_id))  # takes the lock, then waits on the row
            for _ in range(200):
                if await blocker.fetchval(ADVISORY_LOCKS_HELD):
                    break
                await asyncio.sleep(0.01)
            claim.cancel()
            with pytest.raises(asyncio.CancelledError):
                await claim
            await blocker.execute("ROLLBACK")
        for _ in range(200):
            if await locks_held(resources) == 0:
                break
            await asyncio.sleep(0.01)
        assert await locks_held(resources) == 0
        await process_event(resources, row_id)
        assert (await row(resources, row_id))["processed_at"] is not None
    finally:
        await resources.close()


async def test_an_attempts_idle_timeouts_are_set_while_its_lock_is_held_and_cleared_after(settings: Settings) -> None:
    seen: dict[str, str] = {}

    async def handler(context: WebhookContext) -> None:
        for name in ("idle_session_timeout", "idle_in_transaction_session_timeout"):
            seen[name] = str(await context.session.scalar(text(f"SHOW {name}")))

    resources = open_resources(settings, [FeatureModule(name="h", webhook_handlers={"stripe": handler})], pool_size=1)
    try:
        row_id = await insert_raw(resources, "evt_timeouts", """'{"id": "x"}'::jsonb""")
        await process_event(resources, row_id)
        async with driver_connection(resources.db) as connection:  # the same pooled connection, handed back
            after = {name: await connection.fetchval(f"SHOW {name}") for name in seen}
    finally:
        await resources.close()
    assert seen == {"idle_session_timeout": "30s", "idle_in_transaction_session_timeout": "30s"}
    assert set(after.values()) == {"0"}
