"""Writes of Clerk's users, organizations and memberships: in any order the newest wins, and repeats are safe.

Every write is one ``INSERT ... ON CONFLICT`` on the Clerk id, so concurrent
first sightings of one object cannot collide. These rules decide what a late,
early or repeated event does:

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
- a minimal row (``ensure_row``) is only ever inserted, never written over, so
  naming a row in another object's event changes none of its fields.

Hence a live row converges to its newest change, and a deleted row stays
deleted with the fields it held when its deletion arrived (which of its older
changes came before the deletion decides them; docs/architecture.md, identity).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import ColumnElement, CompoundSelect, Table, and_, bindparam, func, or_, select, text
from sqlalchemy.dialects.postgresql import Insert, insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.identity.models import AppUser, Workspace, WorkspaceMember

ClerkModel = type[AppUser] | type[Workspace] | type[WorkspaceMember]


def clerk_time(milliseconds: Any) -> datetime:
    """Clerk stamps times as unix milliseconds."""
    return datetime.fromtimestamp(int(milliseconds) / 1000, UTC)


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


# The statements are built once per model and column set and run with parameters: building an
# INSERT ... ON CONFLICT per event cost more CPU than running it (make bench, Clerk drain profile).


def _table(model: ClerkModel) -> Table:
    return cast(Table, model.__table__)


def _change_applies(table: Table, updated_at: ColumnElement[Any]) -> ColumnElement[bool]:
    """A change at ``updated_at`` writes the stored row: not older than its version, and newer than its deletion.

    Both sides are needed: a minimal row has no version but may be deleted, and
    a deletion leaves the version as it was.
    """
    not_older = or_(table.c.clerk_updated_at.is_(None), table.c.clerk_updated_at <= updated_at)
    after_deletion = or_(table.c.deleted_at.is_(None), table.c.deleted_at < updated_at)
    return and_(not_older, after_deletion)


@functools.cache
def _change_statement(model: ClerkModel, columns: tuple[str, ...], insert_only: tuple[str, ...]) -> Insert:
    key, table = key_column(model), _table(model)
    statement = insert(table).values({name: bindparam(name) for name in (*columns, *insert_only)})
    return statement.on_conflict_do_update(
        index_elements=[key],
        set_={name: statement.excluded[name] for name in columns if name != key},
        where=_change_applies(table, statement.excluded.clerk_updated_at),
    )


@functools.cache
def _deletion_statement(model: ClerkModel, insert_only: tuple[str, ...]) -> Insert:
    key, table = key_column(model), _table(model)
    statement = insert(table).values({name: bindparam(name) for name in (key, "deleted_at", *insert_only)})
    # LEAST ignores NULL in Postgres: the first deletion stamps it, a repeat keeps the earliest time.
    return statement.on_conflict_do_update(
        index_elements=[key], set_={"deleted_at": func.least(table.c.deleted_at, statement.excluded.deleted_at)}
    )


@functools.cache
def _ensure_statement(model: type[AppUser] | type[Workspace], columns: tuple[str, ...]) -> CompoundSelect:
    """Insert if missing and return the id, in one statement (the row may exist, be new, or both)."""
    key, table = key_column(model), _table(model)
    inserted = (
        insert(table)
        .values({name: bindparam(name) for name in columns})
        .on_conflict_do_nothing(index_elements=[key])
        .returning(table.c.id)
        .cte("inserted")
    )
    existing = select(table.c.id).where(table.c[key] == bindparam("lookup_key"))
    return select(inserted.c.id).union_all(existing).limit(1)


async def apply_change(session: AsyncSession, model: ClerkModel, change: ClerkChange) -> None:
    row = {key_column(model): change.key, **change.fields, "clerk_updated_at": change.updated_at}
    statement = _change_statement(model, tuple(row), tuple(change.insert_only))
    await session.execute(statement, {**row, **change.insert_only})


async def apply_deletion(session: AsyncSession, model: ClerkModel, deletion: ClerkDeletion) -> None:
    statement = _deletion_statement(model, tuple(deletion.insert_only))
    await session.execute(
        statement, {key_column(model): deletion.key, "deleted_at": deletion.deleted_at, **deletion.insert_only}
    )


async def ensure_row(session: AsyncSession, model: type[AppUser] | type[Workspace], key: str, **fields: Any) -> int:
    """The row's id, inserting a minimal row (no ``clerk_updated_at``) if Clerk's own event has not come yet.

    An existing row, deleted or not, is left as it is (``ON CONFLICT DO NOTHING``).
    """
    column = key_column(model)
    values = {column: key, **fields}
    row_id = await session.scalar(_ensure_statement(model, tuple(values)), {**values, "lookup_key": key})
    if row_id is None:
        # A concurrent transaction committed the row after this statement's snapshot: read it now.
        row_id = await session.scalar(select(model.id).where(getattr(model, column) == key))
    if row_id is None:  # pragma: no cover - the insert above or a committed one guarantees it
        raise RuntimeError(f"{model.__tablename__} row {key} neither inserted nor found")
    return int(row_id)


_LOCK_WORKSPACE = text("SELECT id FROM workspace WHERE id = :workspace_id FOR UPDATE")
_LOCK_WORKSPACE_BY_ORG = text("SELECT id FROM workspace WHERE clerk_org_id = :clerk_org_id FOR UPDATE")


async def lock_workspace(session: AsyncSession, workspace_id: int) -> bool:
    """Every transaction that changes a workspace's members locks the workspace first (no deadlocks).

    Returns whether the workspace exists.
    """
    return await session.scalar(_LOCK_WORKSPACE, {"workspace_id": workspace_id}) is not None


async def ensure_locked_workspace(session: AsyncSession, clerk_org_id: str, **fields: Any) -> int:
    """The id of the organization's workspace, locked; a minimal row is inserted if Clerk's event has not come yet.

    One round trip when the workspace exists, the usual case.
    """
    workspace_id = await session.scalar(_LOCK_WORKSPACE_BY_ORG, {"clerk_org_id": clerk_org_id})
    if workspace_id is None:
        workspace_id = await ensure_row(session, Workspace, clerk_org_id, **fields)
        await lock_workspace(session, workspace_id)  # a concurrent first sighting may have inserted it
    return int(workspace_id)
