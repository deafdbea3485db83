"""The claim of one attempt, typed: the row it counted, or why it gives none (and whether its lock is held)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import datetime

import asyncpg
import pytest

from app.core.db import driver_connection
from app.core.resources import Resources
from app.webhooks.inbox import AttemptStatements, Claim, Inbox, InboxUpkeep, Unclaimed, event_lock_key

IDLE_TIMEOUT = "30s"


@pytest.fixture
async def driver(resources: Resources) -> AsyncIterator[asyncpg.Connection]:
    """An attempt's connection; what it holds when the test ends is released with it."""
    async with driver_connection(resources.db) as connection:
        yield connection
        await connection.execute("SELECT pg_advisory_unlock_all()")


async def holds_lock(connection: asyncpg.Connection, row_id: int) -> bool:
    held = await connection.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() "
        "AND ((classid::bigint << 32) | objid::bigint) = $1",
        event_lock_key(row_id),
    )
    return bool(held)


async def test_a_claim_is_the_stored_row_with_this_attempt_counted(
    resources: Resources, driver: asyncpg.Connection
) -> None:
    body = json.dumps({"id": "evt_claimed", "data": {"object": {"id": "obj_1"}}})
    stored = await Inbox(resources.db).store(
        "stripe", "evt_claimed", "thing.updated", body, request_id="req-1", tenant_key="cus_1", trace_context="00-ab"
    )
    claim = await AttemptStatements(driver, stored.row_id).claim(IDLE_TIMEOUT)
    assert isinstance(claim, Claim)
    assert (claim.id, claim.provider, claim.event_id, claim.type) == (
        stored.row_id,
        "stripe",
        "evt_claimed",
        "thing.updated",
    )
    assert json.loads(claim.payload) == json.loads(body)
    assert isinstance(claim.received_at, datetime) and claim.received_at.tzinfo is not None
    assert (claim.attempts, claim.last_error) == (1, None)
    assert (claim.request_id, claim.tenant_key, claim.trace_context) == ("req-1", "cus_1", "00-ab")
    assert await holds_lock(driver, stored.row_id)

    await AttemptStatements(driver, stored.row_id).record_error("RuntimeError: boom", unlock=True)
    again = await AttemptStatements(driver, stored.row_id).claim(IDLE_TIMEOUT)
    assert isinstance(again, Claim) and (again.attempts, again.last_error) == (2, "RuntimeError: boom")


async def test_a_claim_of_an_event_locked_elsewhere_is_busy_and_holds_nothing(
    resources: Resources, driver: asyncpg.Connection
) -> None:
    stored = await Inbox(resources.db).store("stripe", "evt_busy", "thing.updated", "{}")
    async with driver_connection(resources.db) as other:
        first = await AttemptStatements(other, stored.row_id).claim(IDLE_TIMEOUT)
        assert isinstance(first, Claim)
        try:
            assert await AttemptStatements(driver, stored.row_id).claim(IDLE_TIMEOUT) is Unclaimed.BUSY
            assert not await holds_lock(driver, stored.row_id)
        finally:
            await AttemptStatements(other, stored.row_id).unlock()
    row = (await Inbox(resources.db).find("evt_busy"))[0]
    assert row.attempts == 1  # the busy claim counted nothing


@pytest.mark.parametrize("how", ["processed", "set aside", "gone"])
async def test_a_claim_of_a_done_event_holds_its_lock_until_unlocked(
    resources: Resources, driver: asyncpg.Connection, how: str
) -> None:
    stored = await Inbox(resources.db).store("stripe", f"evt_{how}", "thing.updated", "{}")
    row_id = stored.row_id
    async with driver_connection(resources.db) as connection:
        if how == "processed":
            await connection.execute("UPDATE webhook_event SET processed_at = now() WHERE id = $1", row_id)
        elif how == "set aside":
            await connection.execute("UPDATE webhook_event SET abandoned_at = now() WHERE id = $1", row_id)
        else:
            await connection.execute("DELETE FROM webhook_event WHERE id = $1", row_id)
    statements = AttemptStatements(driver, row_id)
    assert await statements.claim(IDLE_TIMEOUT) is Unclaimed.DONE
    assert await holds_lock(driver, row_id)
    await statements.unlock()
    assert not await holds_lock(driver, row_id)


async def test_an_attempt_sets_its_event_aside_once_and_only_when_its_alert_went_out(
    resources: Resources, driver: asyncpg.Connection
) -> None:
    stored = await Inbox(resources.db).store("stripe", "evt_aside", "thing.updated", "{}")
    statements = AttemptStatements(driver, stored.row_id)
    assert isinstance(await statements.claim(IDLE_TIMEOUT), Claim)
    with pytest.raises(RuntimeError, match="the alert failed"):
        async with statements.setting_aside("PermanentError: no") as set_aside:
            raise RuntimeError("the alert failed")
    assert (await Inbox(resources.db).find("evt_aside"))[0].state == "failed"  # rolled back: still to set aside

    async with statements.setting_aside("PermanentError: no") as set_aside:
        assert set_aside is not None
        assert (set_aside.provider, set_aside.event_id, set_aside.type) == ("stripe", "evt_aside", "thing.updated")
        assert (set_aside.attempts, set_aside.last_error) == (1, "PermanentError: no")
    assert (await Inbox(resources.db).find("evt_aside"))[0].state == "set_aside"
    async with statements.setting_aside("PermanentError: again") as again:
        assert again is None
    await statements.unlock()
    assert await InboxUpkeep(resources.db).reopen(stored.row_id)
