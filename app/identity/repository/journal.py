"""``workspace_change``, the change journal: the rows a model's flush journals, what operators read, retention.

Identity's own writes journal in the same statement (``journal_sql``); a
``Journaled`` model's flush (billing's mirrors, your own models:
``app/identity/journal.py``) inserts its rows here, on the flush's connection.
Reads are by workspace and time (``ix_workspace_change_workspace_id_at``),
deletions by time (``ix_workspace_change_at``), so neither reads more than it
returns however long the journal is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, Table, insert, select, text, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.journal import JournalEntry
from app.identity.models import WorkspaceChange

_JOURNAL = cast(Table, WorkspaceChange.__table__)
_DELETE_OLD_BATCH = text(
    """
DELETE FROM workspace_change WHERE id IN (
    SELECT id FROM workspace_change WHERE at < :before ORDER BY at LIMIT :limit
)
"""
)


@dataclass(frozen=True)
class JournalRow:
    """A journal row as operators read it."""

    id: int
    workspace_id: int | None
    at: datetime
    source: str
    entity: str
    entity_id: int
    changes: dict[str, Any]


_COLUMNS = (
    WorkspaceChange.id,
    WorkspaceChange.workspace_id,
    WorkspaceChange.at,
    WorkspaceChange.source,
    WorkspaceChange.entity,
    WorkspaceChange.entity_id,
    WorkspaceChange.changes,
)


class JournalRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    @staticmethod
    def insert_flushed(connection: Connection, source: str, entries: Sequence[JournalEntry]) -> None:
        """Within a flush (a ``Journaled`` model's): its rows, on the flush's own connection and transaction."""
        connection.execute(
            insert(_JOURNAL),
            [
                {
                    "workspace_id": entry.workspace_id,
                    "source": source,
                    "entity": entry.entity,
                    "entity_id": entry.entity_id,
                    "changes": dict(entry.changes),
                }
                for entry in entries
            ],
        )

    async def page(self, workspace_id: int, before: tuple[datetime, int] | None, limit: int) -> list[JournalRow]:
        """The workspace's rows, newest first, older than ``before`` (at, id)."""
        query = select(*_COLUMNS).where(WorkspaceChange.workspace_id == workspace_id)
        if before is not None:  # a row comparison: an index condition of ix_workspace_change_workspace_id_at
            query = query.where(tuple_(WorkspaceChange.at, WorkspaceChange.id) < tuple_(*before))
        query = query.order_by(WorkspaceChange.at.desc(), WorkspaceChange.id.desc()).limit(limit)
        return [JournalRow(*row) for row in (await self.session.execute(query)).all()]

    async def caused_by(self, workspace_id: int, sources: Sequence[str], since: datetime) -> list[JournalRow]:
        """The workspace's rows of these sources written at or after ``since``, newest first.

        A change is journaled after its cause arrived: ``since`` (the oldest
        event's arrival) bounds the read without missing any of their rows.
        """
        if not sources:
            return []
        query = (
            select(*_COLUMNS)
            .where(
                WorkspaceChange.workspace_id == workspace_id,
                WorkspaceChange.at >= since,
                WorkspaceChange.source.in_(list(sources)),
            )
            .order_by(WorkspaceChange.at.desc(), WorkspaceChange.id.desc())
        )
        return [JournalRow(*row) for row in (await self.session.execute(query)).all()]

    async def delete_batch(self, before: datetime, limit: int) -> int:
        """Delete up to ``limit`` rows written before ``before``, oldest first; how many."""
        result = await self.session.execute(_DELETE_OLD_BATCH, {"before": before, "limit": limit})
        return int(cast(Any, result).rowcount)
