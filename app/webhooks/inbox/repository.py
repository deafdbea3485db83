"""The inbox repository: the one door to ``webhook_event``, for intake, processing, crons, commands and pages.

It runs the statements of ``inbox/sql.py`` on the driver connections of the
shared SQLAlchemy pool: same pool, same database, a third of an ORM session's
cost on the hot paths. A processing attempt runs its statements on the
connection it holds (the attempt's lock lives on it), so those methods take
that connection.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import asyncpg
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.db import Database, driver_connection
from app.core.tracing import trace_id_of
from app.webhooks.inbox import sql

Outcome = Literal["inserted", "reopened", "existing"]
State = Literal["pending", "failed", "set_aside", "processed"]
STATES: tuple[State, ...] = ("pending", "failed", "set_aside", "processed")


def event_lock_key(row_id: int) -> int:
    """The advisory lock an attempt holds on its event (and a set-aside takes to exclude one)."""
    return sql.LOCK_BASE + row_id


@dataclass(frozen=True, slots=True)
class StoredEvent:
    row_id: int
    outcome: Outcome
    processed: bool
    request_id: str | None = None  # the stored row's: its first delivery's, which its processing logs
    tenant_key: str | None = None  # the stored row's


@dataclass(frozen=True, slots=True)
class PeekedEvent:
    """A synced event as its job sees it before asking for its sync (no lock taken, no attempt counted)."""

    id: int
    provider: str
    type: str
    sync_subject: str | None
    received_at: datetime
    request_id: str | None
    tenant_key: str | None
    trace_context: str | None
    done: bool
    payload: str | None  # only when the row has no subject yet (stored before subjects were kept)


@dataclass(frozen=True)
class EventRecord:
    """An inbox row as operators see it; ``payload`` (the JSON text) only where asked for."""

    id: int
    provider: str
    event_id: str
    type: str
    received_at: datetime
    processed_at: datetime | None
    attempts: int
    last_error: str | None
    abandoned_at: datetime | None
    request_id: str | None = None
    replayed_at: datetime | None = None
    tenant_key: str | None = None
    sync_subject: str | None = None
    related_object: str | None = None
    """A thin event's (Stripe's ``v2.core.event``): the object it is about, ``type id`` (``subscription sub_1``)."""
    trace_context: str | None = None
    payload: str | None = None

    @property
    def trace_id(self) -> str | None:
        """The trace of the delivery that stored it (tracing on), to search a tracing backend with."""
        return trace_id_of(self.trace_context)

    @property
    def state(self) -> State:
        if self.processed_at is not None:
            return "processed"
        if self.abandoned_at is not None:
            return "set_aside"
        return "failed" if self.attempts else "pending"


def _record(row: Any) -> EventRecord:
    return EventRecord(**dict(row))


class Inbox:
    def __init__(self, db: Database) -> None:
        self.db = db

    # Intake --------------------------------------------------------------------------------------------
    async def store(
        self,
        provider: str,
        event_id: str,
        event_type: str,
        payload: str,
        *,
        request_id: str | None = None,
        tenant_key: str | None = None,
        sync_subject: str | None = None,
        trace_context: str | None = None,
        normalized: Callable[[], str] | None = None,
    ) -> StoredEvent:
        """Insert the event once per (provider, event id), committed before this returns.

        ``request_id``: the delivery's (``X-Request-Id``), kept with the row so its processing logs the same id.
        ``tenant_key`` and ``sync_subject``: the event's keys (``EventKeys``), decided by its handling module.
        ``trace_context``: the delivery's trace (tracing on), which the event's attempts continue.
        ``normalized``: the payload re-encoded, stored instead when Postgres refuses ``payload`` as ``jsonb`` (a
        number beyond ``numeric``'s range in a body stored as received).
        """
        args = [provider, event_id, event_type, payload, request_id, tenant_key, sync_subject, trace_context]
        async with driver_connection(self.db) as connection:
            for _ in range(2):
                try:
                    row = await connection.fetchrow(sql.STORE, *args)
                except asyncpg.DataError:
                    if normalized is None:
                        raise
                    args[3], normalized = normalized(), None
                    row = await connection.fetchrow(sql.STORE, *args)
                if row is not None:
                    return StoredEvent(
                        row["id"], row["outcome"], row["processed"], row["request_id"], row["tenant_key"]
                    )
                # A concurrent delivery inserted the row after this statement's snapshot: look again.
        raise RuntimeError(f"Inbox row for {provider} event {event_id} neither inserted nor found")

    # One processing attempt, on the connection that holds its lock -----------------------------------
    @staticmethod
    async def claim(driver: Any, row_id: int, idle_timeout: str) -> Any:
        """Take the event's lock and count the attempt: ``got`` False (locked elsewhere), or the row (None: done)."""
        return await driver.fetchrow(sql.CLAIM, row_id, event_lock_key(row_id), idle_timeout)

    @staticmethod
    async def mark_processed_and_unlock(session: AsyncSession, driver: Any, row_id: int) -> float | None:
        """In the handler's transaction, so the handler's writes and ``processed_at`` commit together.

        ``driver``: the session's connection's own (the claim's). The statement runs on it directly: through the
        session it cost every event 0.2 to 0.4 ms more CPU (the two side by side, on 2 cores). The session is
        flushed first, so the handler's pending writes begin the transaction and are in it before the mark; a
        handler that wrote nothing has no transaction, and the mark commits on its own.

        Returns the seconds from the event's arrival to its processing (both by the database's clock): the
        pipeline's latency. ``None`` for a replayed event (its wait since arrival is the operator's, not the
        pipeline's) and for a row gone meanwhile. A set-aside event reopened and processed counts: it waited
        that long.
        """
        await session.flush()
        took = await driver.fetchval(sql.MARK_PROCESSED_AND_UNLOCK, row_id, event_lock_key(row_id))
        return None if took is None else float(took)

    @staticmethod
    async def record_error(driver: Any, row_id: int, error: str, *, unlock: bool) -> None:
        if unlock:
            await driver.execute(sql.RECORD_ERROR_AND_UNLOCK, row_id, error, event_lock_key(row_id))
        else:
            await driver.execute(sql.RECORD_ERROR, row_id, error)

    @staticmethod
    async def uncount(driver: Any, row_id: int, *, unlock: bool) -> None:
        """Give back the attempt the claim counted: the remote side asked for it to be made later."""
        if unlock:
            await driver.execute(sql.UNCOUNT_AND_UNLOCK, row_id, event_lock_key(row_id))
        else:
            await driver.execute(sql.UNCOUNT, row_id)

    @staticmethod
    async def set_aside_one(driver: Any, row_id: int, error: str) -> Any:
        """Within the caller's transaction: the row set aside (to alert about before committing), or None."""
        return await driver.fetchrow(sql.SET_ASIDE_ONE, row_id, error)

    @staticmethod
    async def unlock(driver: Any, row_id: int) -> None:
        await driver.execute(sql.UNLOCK, event_lock_key(row_id))

    # Synced events (a sync of their subject covers them) -----------------------------------------------
    async def peek(self, row_id: int) -> PeekedEvent | None:
        async with driver_connection(self.db) as connection:
            row = await connection.fetchrow(sql.PEEK, row_id)
        return PeekedEvent(**dict(row)) if row is not None else None

    async def set_subject(self, row_id: int, subject: str) -> None:
        """Give a row stored before subjects were kept the subject its syncs find it by."""
        async with driver_connection(self.db) as connection:
            await connection.execute(sql.SET_SUBJECT, row_id, subject)

    async def covered(self, subject: str, read_began: datetime) -> tuple[datetime | None, int | None]:
        """Of the events a sync of ``subject`` whose read began at ``read_began`` covers: when the latest arrived,
        and the row id of the last stored (both None: it covers none)."""
        async with driver_connection(self.db) as connection:
            row = await connection.fetchrow(sql.COVERED, subject, read_began)
        return row["newest_at"], row["newest"]

    @staticmethod
    async def mark_covered(
        session: AsyncSession, subject: str, read_began: datetime
    ) -> list[tuple[str, float | None, str | None]]:
        """In the sync's transaction: its events processed with what it wrote; (provider, pipeline seconds, trace
        context) each."""
        rows = (await session.execute(sql.MARK_COVERED, {"subject": subject, "read_began": read_began})).all()
        return [(row.provider, None if row.took is None else float(row.took), row.trace_context) for row in rows]

    async def record_covered_failure(self, subject: str, read_began: datetime, error: str) -> list[int]:
        """A failed sync counts an attempt of each event it covers; their attempts now."""
        async with driver_connection(self.db) as connection:
            return [
                row["attempts"]
                for row in await connection.fetch(sql.RECORD_COVERED_FAILURE, subject, read_began, error)
            ]

    @asynccontextmanager
    async def setting_aside_covered(self, subject: str, read_began: datetime, error: str) -> AsyncIterator[list[Any]]:
        """The events a sync covers set aside (a permanent error), committed only after the block (the alert)."""
        async with driver_connection(self.db) as connection, connection.transaction():
            yield list(await connection.fetch(sql.SET_ASIDE_COVERED, subject, read_began, error))

    # Crons --------------------------------------------------------------------------------------------
    async def pending_page(self, received_before: datetime, after: tuple[datetime, int], limit: int) -> list[Any]:
        """Unprocessed rows not set aside, oldest first, from after ``after`` (received_at, id)."""
        async with driver_connection(self.db) as connection:
            return list(await connection.fetch(sql.PENDING_PAGE, received_before, *after, limit))

    @asynccontextmanager
    async def setting_aside(self, row_ids: Sequence[int]) -> AsyncIterator[list[Any]]:
        """The rows set aside, committed only when the block (their alerts) ends without an error.

        A crash before the commit leaves them pending, so the next tick sets them
        aside and alerts again: an alert may repeat, but is never lost. Rows a
        running attempt holds are skipped; a concurrent tick waits on the row
        locks, then finds them set aside.
        """
        async with driver_connection(self.db) as connection, connection.transaction():
            yield list(await connection.fetch(sql.SET_ASIDE_EXHAUSTED, list(row_ids), event_lock_key(0)))

    async def delete_processed_batch(self, processed_before: datetime, limit: int) -> int:
        async with driver_connection(self.db) as connection:
            status = await connection.execute(sql.DELETE_PROCESSED_BATCH, processed_before, limit)
        return int(status.split()[-1])

    async def reopen(self, row_id: int | None = None) -> list[Any]:
        """Give set-aside events (or the one) their attempts back; the reopened rows (id, provider, request id, tenant
        key, trace context)."""
        async with driver_connection(self.db) as connection:
            return list(await connection.fetch(sql.REOPEN, row_id))

    # Operators ------------------------------------------------------------------------------------------
    async def page(
        self,
        *,
        provider: str | None = None,
        state: State | None = None,
        event_type: str | None = None,
        event_id: str | None = None,
        tenant_key: str | None = None,
        before_id: int | None = None,
        limit: int = 50,
    ) -> list[EventRecord]:
        """Newest first; the next page starts ``before_id`` = the last id of this one."""
        statement = sql.PAGE.format(state=sql.STATE_CONDITIONS[state] if state else "true")
        async with driver_connection(self.db) as connection:
            rows = await connection.fetch(statement, provider, event_type, event_id, limit, before_id, tenant_key)
        return [_record(row) for row in rows]

    async def of_tenants(
        self, tenant_keys: Sequence[str], before: tuple[datetime, int] | None, limit: int
    ) -> list[EventRecord]:
        """Every event of these tenants, newest first, older than ``before`` (received_at, id)."""
        async with driver_connection(self.db) as connection:
            if before is None:
                rows = await connection.fetch(sql.TENANTS_PAGE, list(tenant_keys), limit)
            else:
                rows = await connection.fetch(sql.TENANTS_PAGE_BEFORE, list(tenant_keys), limit, *before)
        return [_record(row) for row in rows]

    async def unprocessed_of_tenants(self, tenant_keys: Sequence[str], limit: int) -> list[EventRecord]:
        """The events of these tenants still to process (pending or failed; not set aside), oldest first."""
        async with driver_connection(self.db) as connection:
            return [_record(row) for row in await connection.fetch(sql.TENANTS_UNPROCESSED, list(tenant_keys), limit)]

    async def find(self, identifier: str, provider: str | None = None) -> list[EventRecord]:
        """By row id or provider event id."""
        row_id = int(identifier) if identifier.isdigit() and len(identifier) < 19 else None
        async with driver_connection(self.db) as connection:
            return [_record(row) for row in await connection.fetch(sql.FIND, identifier, row_id, provider)]

    async def keys_of(self, provider: str, event_id: str) -> tuple[str | None, str | None] | None:
        """The (tenant key, sync subject) the event was stored with; None when the inbox does not hold it."""
        async with driver_connection(self.db) as connection:
            row = await connection.fetchrow(sql.KEYS_OF, provider, event_id)
        return (row["tenant_key"], row["sync_subject"]) if row is not None else None

    async def missing(self, provider: str, event_ids: Sequence[str]) -> set[str]:
        """The event ids of ``provider`` the inbox holds no row for (set aside or processed count as held)."""
        if not event_ids:
            return set()
        async with driver_connection(self.db) as connection:
            present = {row["event_id"] for row in await connection.fetch(sql.PRESENT, provider, list(event_ids))}
        return set(event_ids) - present

    async def get(self, row_id: int) -> EventRecord | None:
        """One row with its payload (as stored, JSON text)."""
        async with driver_connection(self.db) as connection:
            row = await connection.fetchrow(sql.GET_WITH_PAYLOAD, row_id)
        return _record(row) if row is not None else None

    async def reset_for_replay(self, row_id: int) -> None:
        """Make a processed (or any) event new again: unprocessed, not set aside, no attempts."""
        async with driver_connection(self.db) as connection:
            await connection.execute(sql.RESET_FOR_REPLAY, row_id)

    async def latency_last_hour(self) -> dict[str, tuple[int, float, float]]:
        """Per provider: events processed in the last hour, and the p50 and p99 seconds from arrival to processing."""
        async with driver_connection(self.db) as connection:
            rows = await connection.fetch(sql.LATENCY_LAST_HOUR)
        return {row["provider"]: (int(row["n"]), float(row["p50"]), float(row["p99"])) for row in rows}

    async def unprocessed_counts(self) -> dict[str, dict[str, int]]:
        """Per provider: events pending, failed and set aside (the partial indexes only: each scrape asks)."""
        async with driver_connection(self.db) as connection, connection.transaction():
            await connection.execute(sql.NO_TABLE_SCAN)  # the partial indexes, whatever the statistics say
            rows = await connection.fetch(sql.UNPROCESSED_COUNTS)
        counts: dict[str, dict[str, int]] = {}
        for row in rows:
            provider = counts.setdefault(row["provider"], {"pending": 0, "failed": 0, "set_aside": 0})
            for state in ("pending", "failed", "set_aside"):
                provider[state] += int(row[state])
        return counts

    async def queue_tenants(self) -> dict[str, tuple[int, float]]:
        """Per provider: the tenants with unprocessed events, and the seconds since the oldest of those arrived."""
        async with driver_connection(self.db) as connection, connection.transaction():
            await connection.execute(sql.NO_TABLE_SCAN)  # the partial indexes, whatever the statistics say
            rows = await connection.fetch(sql.QUEUE_TENANTS)
        return {row["provider"]: (int(row["tenants"]), float(row["oldest_seconds"] or 0.0)) for row in rows}

    async def top_tenants(self, limit: int = 10) -> list[Any]:
        """The tenants with the most unprocessed events: provider, tenant key, how many, the oldest's arrival."""
        async with driver_connection(self.db) as connection:
            return list(await connection.fetch(sql.TOP_TENANTS, limit))

    async def processed_last_day(self) -> dict[str, int]:
        """Per provider: events processed in the last 24 hours (a day of rows: the overview's, not a scrape's)."""
        async with driver_connection(self.db) as connection:
            return {row["provider"]: int(row["n"]) for row in await connection.fetch(sql.PROCESSED_LAST_DAY)}

    async def counts(self) -> dict[str, dict[str, int]]:
        """Per provider: events pending, failed, set aside, and processed in the last 24 hours."""
        counts = await self.unprocessed_counts()
        for provider, processed in (await self.processed_last_day()).items():
            counts.setdefault(provider, {"pending": 0, "failed": 0, "set_aside": 0})["processed_24h"] = processed
        return counts
