"""The rows copied from Clerk: ``app_user``, ``workspace`` and ``workspace_member``, by their Clerk ids.

Clerk's objects are written so that in any order the newest wins and repeats
are safe. Every write is one ``INSERT ... ON CONFLICT`` on the Clerk id (with
its journal rows: ``journal_sql``), so concurrent first sightings of one object
cannot collide, and these rules decide what a late, early or repeated event does:

- a change applies only if its ``updated_at`` is not older than
  ``clerk_updated_at`` (a row first seen through another object's event has
  none, so any change wins). An equal one applies again: it carries the same
  data, so that is harmless, and a replay after a handler fix takes effect;
- a deletion is the newest change of its object: it stamps ``deleted_at`` (the
  earliest deletion time seen) and never touches ``clerk_updated_at``, and once
  a row is deleted no change with an ``updated_at`` at or before ``deleted_at``
  writes any of its fields (only a newer one would; Clerk sends none, as a
  deleted object does not change);
- nothing clears ``deleted_at``: Clerk never brings a deleted object back, so
  neither does a late event;
- a minimal row (``ensure``) is only ever inserted, never written over, so
  naming a row in another object's event changes none of its fields.

Hence a live row converges to its newest change, and a deleted row stays
deleted with the fields it held when its deletion arrived (which of its older
changes came before the deletion decides them; docs/behaviour.md, events out
of order).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, cast

from sqlalchemy import Table, TextClause, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.identity.models import AppUser, Workspace, WorkspaceMember
from app.identity.repository.journal_sql import journaled, run, state, typed

ClerkModel = type[AppUser] | type[Workspace] | type[WorkspaceMember]
Version = tuple[datetime | None, datetime | None]
"""A stored row's ``clerk_updated_at`` and ``deleted_at``."""


@dataclass(frozen=True)
class ClerkChange:
    """A created or updated object: its ``fields`` apply unless the stored version or deletion is newer or as new.

    "As new" differs between the two: an equal version applies again, a change
    at the deletion's own time does not.
    """

    key: str
    updated_at: datetime
    fields: dict[str, Any]
    # Written only when the row is new (e.g. a new workspace's member limit).
    insert_only: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ClerkDeletion:
    """A deleted object; ``insert_only`` holds what a row needs if the deletion is the first sighting."""

    key: str
    deleted_at: datetime
    insert_only: dict[str, Any] = field(default_factory=dict)


def key_column(model: ClerkModel) -> str:
    return {AppUser: "clerk_user_id", Workspace: "clerk_org_id", WorkspaceMember: "clerk_membership_id"}[model]


def workspace_of(model: ClerkModel, alias: str) -> str:
    """The journal's ``workspace_id`` of a row: a workspace's own, a member's, none for a user."""
    return {AppUser: "NULL::bigint", Workspace: f"{alias}.id", WorkspaceMember: f"{alias}.workspace_id"}[model]


# The statements are built once per model and column set and run with parameters: building an
# INSERT ... ON CONFLICT per event cost more CPU than running it (make bench, Clerk drain profile).


def _table(model: ClerkModel) -> Table:
    return cast(Table, model.__table__)


def returned(model: ClerkModel, alias: str = "t") -> str:
    """What a write returns for its journal rows (``journal_sql``): the row's id, workspace and state."""
    return f"{alias}.id, {workspace_of(model, alias)} AS workspace_id, {state(_table(model), alias)} AS state"


def _locked_old(model: ClerkModel) -> str:
    """The stored row, locked before the upsert reads ``old`` (``locked_first``), so its diff is against it."""
    key, table = key_column(model), _table(model)
    return (
        f"old AS MATERIALIZED (SELECT t.id, {state(table, 't')} AS state FROM {table.name} AS t "
        f"WHERE t.{key} = :{key} FOR UPDATE)"
    )


_WRITTEN = (
    "written AS (SELECT u.id, u.workspace_id, u.state, o.state AS old_state "
    "FROM upserted AS u LEFT JOIN old AS o ON o.id = u.id)"
)
# A change at excluded.clerk_updated_at writes the stored row: not older than its version, and newer than its
# deletion. Both sides are needed: a minimal row has no version but may be deleted, and a deletion leaves the
# version as it was.
_CHANGE_APPLIES = (
    "(t.clerk_updated_at IS NULL OR t.clerk_updated_at <= excluded.clerk_updated_at) "
    "AND (t.deleted_at IS NULL OR t.deleted_at < excluded.clerk_updated_at)"
)


def _upsert(model: ClerkModel, names: Sequence[str], on_conflict: str) -> TextClause:
    table = _table(model)
    values = ", ".join(typed(table, name) for name in names)
    return journaled(
        table.name,
        f"""WITH {_locked_old(model)},
upserted AS (
    INSERT INTO {table.name} AS t ({", ".join(names)}) SELECT {values} FROM (SELECT count(*) FROM old) AS locked_first
    ON CONFLICT ({key_column(model)}) {on_conflict}
    RETURNING {returned(model)}
), {_WRITTEN}""",
        "SELECT {journaled}",
    )


@functools.cache
def _change_statement(model: ClerkModel, columns: tuple[str, ...], insert_only: tuple[str, ...]) -> TextClause:
    key = key_column(model)
    updates = ", ".join(f"{name} = excluded.{name}" for name in columns if name != key)
    return _upsert(model, (*columns, *insert_only), f"DO UPDATE SET {updates} WHERE {_CHANGE_APPLIES}")


@functools.cache
def _deletion_statement(model: ClerkModel, insert_only: tuple[str, ...]) -> TextClause:
    # LEAST ignores NULL in Postgres: the first deletion stamps it, a repeat keeps the earliest time.
    names = (key_column(model), "deleted_at", *insert_only)
    return _upsert(model, names, "DO UPDATE SET deleted_at = LEAST(t.deleted_at, excluded.deleted_at)")


@functools.cache
def _ensure_statement(model: ClerkModel, columns: tuple[str, ...]) -> TextClause:
    """Insert if missing and return the id, in one statement (the row may exist, be new, or both)."""
    key, table = key_column(model), _table(model)
    values = ", ".join(typed(table, name) for name in columns)
    return journaled(
        table.name,
        f"""WITH old AS (SELECT NULL::bigint AS id, NULL::jsonb AS state WHERE false),
upserted AS (
    INSERT INTO {table.name} AS t ({", ".join(columns)}) VALUES ({values})
    ON CONFLICT ({key}) DO NOTHING
    RETURNING {returned(model)}
), {_WRITTEN}""",
        f"SELECT found.id, {{journaled}} FROM (SELECT id FROM upserted UNION ALL "
        f"SELECT id FROM {table.name} WHERE {key} = :lookup_key) AS found LIMIT 1",
    )


@functools.cache
def _delete_now_statement(model: ClerkModel) -> TextClause:
    key, table = key_column(model), _table(model)
    return journaled(
        table.name,
        f"""WITH old AS MATERIALIZED (
    SELECT t.id, {state(table, "t")} AS state FROM {table.name} AS t
    WHERE t.{key} = ANY(CAST(:keys AS VARCHAR[])) AND t.deleted_at IS NULL FOR UPDATE
), written AS (
    UPDATE {table.name} AS t SET deleted_at = now() FROM old WHERE t.id = old.id
    RETURNING {returned(model)}, old.state AS old_state
)""",
        "SELECT {journaled}",
    )


class ClerkRows:
    """The statements every table copied from Clerk shares, on the subclass's ``model``."""

    model: ClassVar[ClerkModel]

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def apply_change(self, change: ClerkChange) -> None:
        row = {key_column(self.model): change.key, **change.fields, "clerk_updated_at": change.updated_at}
        statement = _change_statement(self.model, tuple(row), tuple(change.insert_only))
        await run(self.session, statement, {**row, **change.insert_only})

    async def apply_deletion(self, deletion: ClerkDeletion) -> None:
        statement = _deletion_statement(self.model, tuple(deletion.insert_only))
        values = {key_column(self.model): deletion.key, "deleted_at": deletion.deleted_at, **deletion.insert_only}
        await run(self.session, statement, values)

    async def ensure(self, key: str, **fields: Any) -> int:
        """The row's id, inserting a minimal row (no ``clerk_updated_at``) if Clerk's own event has not come yet.

        An existing row, deleted or not, is left as it is (``ON CONFLICT DO NOTHING``).
        """
        column = key_column(self.model)
        values = {column: key, **fields}
        rows = await run(self.session, _ensure_statement(self.model, tuple(values)), {**values, "lookup_key": key})
        row_id = rows[0].id if rows else None
        if row_id is None:
            # A concurrent transaction committed the row after this statement's snapshot: read it now.
            row_id = await self.session.scalar(select(self.model.id).where(getattr(self.model, column) == key))
        if row_id is None:  # pragma: no cover - the insert above or a committed one guarantees it
            raise RuntimeError(f"{self.model.__tablename__} row {key} neither inserted nor found")
        return int(row_id)

    async def versions(self) -> dict[str, Version]:
        """Each row's Clerk id -> its version; rows with no Clerk id (a workspace made here) are none of Clerk's."""
        key = getattr(self.model, key_column(self.model))
        query = select(key, self.model.clerk_updated_at, self.model.deleted_at).where(key.is_not(None))
        return {str(row[0]): (row[1], row[2]) for row in (await self.session.execute(query)).all()}

    async def delete_now(self, keys: Sequence[str]) -> None:
        """Soft-delete the live rows of these Clerk ids, stamped with this transaction's time (Clerk's is unknown)."""
        await run(self.session, _delete_now_statement(self.model), {"keys": list(keys)})


class UserRepository(ClerkRows):
    """``app_user``."""

    model = AppUser


class MemberRows(ClerkRows):
    """``workspace_member``, reached through :attr:`WorkspaceRepository.members`."""

    model = WorkspaceMember
