"""The change journal (``workspace_change``) for any model: one declaration, ``Journaled``, and its retention.

Identity's own tables journal in their repository's statements
(``repository/journal_sql.py``). Any other model joins the journal by
deriving from :class:`Journaled`::

    class Invoice(Journaled, Base):
        __tablename__ = "invoice"
        workspace_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("workspace.id"))

Then every flush of its rows (``session.add``, attributes set, ``session.delete``)
journals, in the flush's transaction, one row per row changed with the columns
that changed (``[stored, new]``; a new row's stored values are null) and the
cause of the unit of work (``app/core/journal.py``). A column marked
``info=NOT_JOURNALED`` is left out, and a row whose other columns did not
change journals nothing. Statements that bypass the session's unit of work
(``session.execute(update(...))``) are not seen: write journaled rows through
the session, as billing's mirrors do.
"""

from __future__ import annotations

import logging
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any, ClassVar

from sqlalchemy import ClauseElement, event, inspect
from sqlalchemy.orm import Session, UOWTransaction

from app.core.journal import JournalEntry, current_cause, note
from app.core.resources import Resources
from app.identity.repository import JournalRepository, journal_sql

logger = logging.getLogger(__name__)

RETENTION_BATCH_SIZE = 5000


class Journaled:
    """Mix into a model so that every flush of its rows is journaled (see the module's docstring)."""

    journal_workspace: ClassVar[str | None] = "workspace_id"
    """The attribute holding the workspace a row belongs to (None: it belongs to none)."""


def _json(value: Any) -> Any:
    """A column's value as the journal stores it: what Postgres' ``to_jsonb`` makes of it."""
    if isinstance(value, ClauseElement):  # set to a SQL expression (func.now()): the database decides the value
        return f"set by the database: {value}"
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    return value


def _entry(row: Journaled, new: bool, deleted: bool) -> JournalEntry | None:
    state = inspect(row)
    changes: dict[str, list[Any]] = {}
    for attribute in state.mapper.column_attrs:
        column = attribute.columns[0]
        if column.name == "id" or not column.info.get("journal", True):
            continue
        history = state.attrs[attribute.key].history
        if new:
            before, after = None, getattr(row, attribute.key)
        elif deleted:
            before, after = (history.unchanged or history.deleted or [None])[0], None
        elif history.has_changes():
            before, after = (history.deleted or [None])[0], (history.added or [None])[0]
        else:
            continue
        if _json(before) != _json(after):
            changes[column.name] = [_json(before), _json(after)]
    if not changes:
        return None
    workspace = getattr(row, row.journal_workspace) if row.journal_workspace else None
    return JournalEntry(state.mapper.local_table.name, int(getattr(row, "id")), workspace, changes)  # noqa: B009


@event.listens_for(Session, "after_flush")
def _journal_flushed(session: Session, _flush_context: UOWTransaction) -> None:
    """After the flush's statements, in its transaction: the journaled rows it wrote (history is still there)."""
    if not journal_sql.JOURNAL_WRITES:
        return
    entries = [
        entry
        for rows, new, deleted in (
            (session.new, True, False),
            (session.dirty, False, False),
            (session.deleted, False, True),
        )
        for row in rows
        if isinstance(row, Journaled) and (entry := _entry(row, new, deleted)) is not None
    ]
    if entries:
        JournalRepository.insert_flushed(session.connection(), current_cause(), entries)
        note(entries)


async def delete_old_changes(resources: Resources, now: datetime | None = None) -> int:
    """Journal rows older than ``WORKSPACE_CHANGE_RETENTION_DAYS``, deleted in short batches (each its transaction).

    The retention cron runs it (``MODULE.retention``), after the inbox's own.
    """
    days = resources.settings.workspace_change_retention_days
    before = (now or datetime.now(UTC)) - timedelta(days=days)
    deleted = 0
    while True:
        async with resources.db.session() as session:
            batch = await JournalRepository(session).delete_batch(before, RETENTION_BATCH_SIZE)
            await session.commit()
        deleted += batch
        if batch < RETENTION_BATCH_SIZE:
            return deleted
