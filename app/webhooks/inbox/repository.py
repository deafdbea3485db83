"""The inbox repository: the one door to ``webhook_event``, its statements split by who runs them.

- :class:`Inbox` (here): the intake's and the backfill's (store an event, what is
  stored of one), and, inherited, the operator's reads (``reads.py``: pages, one
  event, counts, a workspace's timeline);
- :class:`~app.webhooks.inbox.attempt.AttemptStatements`: one processing attempt's,
  with its typed :class:`~app.webhooks.inbox.attempt.Claim`;
- :class:`~app.webhooks.inbox.coverage.InboxCoverage`: what a sync does to the events it covers;
- :class:`~app.webhooks.inbox.upkeep.InboxUpkeep`: the crons' and the operator commands' writes.

Each runs the statements of ``inbox/sql.py`` on the driver connections of the
shared SQLAlchemy pool: same pool, same database, a third of an ORM session's
cost on the hot paths. Only this package runs SQL on ``webhook_event``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import asyncpg

from app.core.db import driver_connection
from app.webhooks.inbox import sql
from app.webhooks.inbox.reads import InboxReads
from app.webhooks.inbox.records import StoredEvent


class Inbox(InboxReads):
    """Events stored (the intake, the backfill) and read (operators: :class:`InboxReads`)."""

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
            try:
                row = await _stored(connection, args)
            except asyncpg.DataError:
                if normalized is None:
                    raise
                args[3] = normalized()
                row = await _stored(connection, args)
        return StoredEvent(row["id"], row["outcome"], row["processed"], row["request_id"], row["tenant_key"])

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


async def _stored(connection: asyncpg.Connection, args: list[str | None]) -> asyncpg.Record:
    """``STORE``'s row; asked again when a concurrent delivery inserted it after the statement's snapshot."""
    for _ in range(2):
        row = await connection.fetchrow(sql.STORE, *args)
        if row is not None:
            return row
    raise RuntimeError(f"Inbox row for {args[0]} event {args[1]} neither inserted nor found")
