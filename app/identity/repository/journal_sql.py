"""The change journal in identity's own statements: each write and its ``workspace_change`` rows in one statement.

A journaled statement is a ``WITH`` whose last common table expression,
``written``, returns one row per row the write changed or inserted: ``id``,
``workspace_id`` (NULL for a user: a user belongs to no one workspace),
``state`` (the row's journaled columns after the write, as a JSON object) and
``old_state`` (before it; NULL for a new row). :func:`journaled` adds the
journal's insert: one row per written row whose state differs, with only the
columns that differ, each as ``[stored, new]``, and the cause. A row written
with the values it held journals nothing, so a repeated event, a no-op replay
or a sync that read what was stored leaves no trace.

``old_state`` must be the row as it was under this transaction's lock, not as
an older snapshot saw it: an upsert reads it ``FOR UPDATE`` in a materialized
expression that the write itself reads first (``locked_first``), so a
concurrent change committed meanwhile is the one diffed against; a statement
run under the workspace's row lock (seats, billing) may read it by key.

One statement, not a write and then an insert: a Clerk event's worker CPU is
mostly per statement (bench/README.md), so the journal costs its rows, not a
round trip.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import String, Table, TextClause, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.journal import JournalEntry, current_cause, is_previewing, note

JOURNAL_WRITES = True
"""The product always journals. ``bench/without_journal.py`` sets this to False before anything is built, to
measure what the journal's writes cost; nothing else changes it (there is no setting)."""

_JOURNAL = """
, journal AS (
    INSERT INTO workspace_change (workspace_id, source, entity, entity_id, changes)
    SELECT w.workspace_id, :journal_source, '{entity}', w.id, d.changes
    FROM written AS w
    CROSS JOIN LATERAL (
        SELECT jsonb_object_agg(n.key, jsonb_build_array(w.old_state -> n.key, n.value)) AS changes
        FROM jsonb_each(w.state) AS n
        WHERE coalesce(w.old_state -> n.key, 'null') IS DISTINCT FROM n.value
    ) AS d
    WHERE d.changes IS NOT NULL
    RETURNING workspace_id, entity, entity_id, changes
)"""
JOURNALED = "(SELECT jsonb_agg(to_jsonb(journal)) FROM journal) AS journaled"
"""The journal rows a statement wrote, for a dry run (``app.core.journal.previewing``)."""
_NOTHING_JOURNALED = "NULL::jsonb AS journaled"


def journaled_columns(table: Table) -> tuple[str, ...]:
    """Every column but the id and those marked ``info=NOT_JOURNALED`` (bookkeeping: versions, sync times)."""
    return tuple(column.name for column in table.columns if column.name != "id" and column.info.get("journal", True))


def state(table: Table, alias: str) -> str:
    """The row's journaled columns as one JSON object."""
    pairs = ", ".join(f"'{name}', {alias}.{name}" for name in journaled_columns(table))
    return f"jsonb_build_object({pairs})"


def typed(table: Table, name: str) -> str:
    """A bound value cast to its column's type: ``INSERT ... SELECT`` gives Postgres no column to infer it from.

    A string is cast to ``VARCHAR`` without its length: a cast to ``VARCHAR(64)`` would cut a longer value
    silently, where the insert refuses it.
    """
    column_type = table.c[name].type
    name_of_type = "VARCHAR" if isinstance(column_type, String) else column_type.compile(dialect=postgresql.dialect())
    return f"CAST(:{name} AS {name_of_type})"


def journaled(entity: str, with_written: str, result: str) -> TextClause:
    """``with_written`` (``WITH ... written AS (...)``), the journal's insert, then ``result``.

    ``result`` is the statement's last ``SELECT``; it puts the journal rows it wrote where it says
    ``{journaled}``, and binds ``:journal_source`` (see :func:`run`).
    """
    if not JOURNAL_WRITES:
        return text(f"{with_written}\n{result.format(journaled=_NOTHING_JOURNALED)}")
    return text(f"{with_written}{_JOURNAL.format(entity=entity)}\n{result.format(journaled=JOURNALED)}")


async def run(session: AsyncSession, statement: TextClause, values: dict[str, Any]) -> Sequence[Row[Any]]:
    """Run a journaled statement with this unit of work's cause; its rows (a dry run also gets what it journaled)."""
    rows = (await session.execute(statement, {**values, "journal_source": current_cause()})).all()
    if rows and is_previewing():
        note(entries(rows[0].journaled))
    return rows


def entries(journaled: Any) -> list[JournalEntry]:
    """The journal rows a statement returned (JSON text or already decoded) as entries."""
    if journaled is None:
        return []
    rows = json.loads(journaled) if isinstance(journaled, str) else journaled
    return [JournalEntry(r["entity"], int(r["entity_id"]), r["workspace_id"], r["changes"]) for r in rows]
