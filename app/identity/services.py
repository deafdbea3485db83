"""Writes of Clerk's users, organizations and memberships: order-independent and safe to repeat.

Every write is one ``INSERT ... ON CONFLICT`` on the Clerk id, so concurrent
first sightings of one object cannot collide. Two rules make the result the
same whatever the order, delay or repetition of the events:

- a change applies only if its ``updated_at`` is newer than ``clerk_updated_at``
  (a row first seen through another object's event has none, so any change wins);
- a deletion only stamps ``deleted_at`` (the earliest deletion time seen) and
  never touches ``clerk_updated_at``, and nothing clears ``deleted_at``: Clerk
  never brings a deleted object back, so neither does a late event.

Hence the fields converge to the newest change and the row stays deleted once a
deletion arrived, before or after the changes it follows.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import CompoundSelect, Table, bindparam, func, or_, select
from sqlalchemy.dialects.postgresql import Insert, insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.identity.models import AppUser, Workspace, WorkspaceMember

ClerkModel = type[AppUser] | type[Workspace] | type[WorkspaceMember]


def clerk_time(milliseconds: Any) -> datetime:
    """Clerk stamps times as unix milliseconds."""
    return datetime.fromtimestamp(int(milliseconds) / 1000, UTC)


@dataclass(frozen=True)
class ClerkChange:
    """A created or updated object: its ``fields`` apply if ``updated_at`` is newer than what is stored."""

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


def _key_column(model: ClerkModel) -> str:
    return {AppUser: "clerk_user_id", Workspace: "clerk_org_id", WorkspaceMember: "clerk_membership_id"}[model]


# The statements are built once per model and column set and run with parameters: building an
# INSERT ... ON CONFLICT per event cost more CPU than running it (make bench, Clerk drain profile).


def _table(model: ClerkModel) -> Table:
    return cast(Table, model.__table__)


@functools.cache
def _change_statement(model: ClerkModel, columns: tuple[str, ...], insert_only: tuple[str, ...]) -> Insert:
    key, table = _key_column(model), _table(model)
    statement = insert(table).values({name: bindparam(name) for name in (*columns, *insert_only)})
    return statement.on_conflict_do_update(
        index_elements=[key],
        set_={name: statement.excluded[name] for name in columns if name != key},
        where=or_(table.c.clerk_updated_at.is_(None), table.c.clerk_updated_at < statement.excluded.clerk_updated_at),
    )


@functools.cache
def _deletion_statement(model: ClerkModel, insert_only: tuple[str, ...]) -> Insert:
    key, table = _key_column(model), _table(model)
    statement = insert(table).values({name: bindparam(name) for name in (key, "deleted_at", *insert_only)})
    # LEAST ignores NULL in Postgres: the first deletion stamps it, a repeat keeps the earliest time.
    return statement.on_conflict_do_update(
        index_elements=[key], set_={"deleted_at": func.least(table.c.deleted_at, statement.excluded.deleted_at)}
    )


@functools.cache
def _ensure_statement(model: type[AppUser] | type[Workspace], columns: tuple[str, ...]) -> CompoundSelect:
    """Insert if missing and return the id, in one statement (the row may exist, be new, or both)."""
    key, table = _key_column(model), _table(model)
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
    row = {_key_column(model): change.key, **change.fields, "clerk_updated_at": change.updated_at}
    statement = _change_statement(model, tuple(row), tuple(change.insert_only))
    await session.execute(statement, {**row, **change.insert_only})


async def apply_deletion(session: AsyncSession, model: ClerkModel, deletion: ClerkDeletion) -> None:
    statement = _deletion_statement(model, tuple(deletion.insert_only))
    await session.execute(
        statement, {_key_column(model): deletion.key, "deleted_at": deletion.deleted_at, **deletion.insert_only}
    )


async def ensure_row(session: AsyncSession, model: type[AppUser] | type[Workspace], key: str, **fields: Any) -> int:
    """The row's id, inserting a minimal row (no ``clerk_updated_at``) if Clerk's own event has not come yet."""
    key_column = _key_column(model)
    values = {key_column: key, **fields}
    row_id = await session.scalar(_ensure_statement(model, tuple(values)), {**values, "lookup_key": key})
    if row_id is None:
        # A concurrent transaction committed the row after this statement's snapshot: read it now.
        row_id = await session.scalar(select(model.id).where(getattr(model, key_column) == key))
    if row_id is None:  # pragma: no cover - the insert above or a committed one guarantees it
        raise RuntimeError(f"{model.__tablename__} row {key} neither inserted nor found")
    return int(row_id)


@dataclass(frozen=True)
class MemberLimitResult:
    suspended: list[int] = field(default_factory=list)
    restored: list[int] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.suspended or self.restored)


_LOCK_WORKSPACE = select(Workspace).where(Workspace.id == bindparam("workspace_id")).with_for_update()
_ACTIVE_MEMBERS = (
    select(WorkspaceMember)
    .where(WorkspaceMember.workspace_id == bindparam("workspace_id"), WorkspaceMember.deleted_at.is_(None))
    .order_by(WorkspaceMember.created_at, WorkspaceMember.id)
)


async def lock_workspace(session: AsyncSession, workspace_id: int) -> Workspace | None:
    """Every transaction that changes a workspace's members locks the workspace first (no deadlocks)."""
    return await session.scalar(_LOCK_WORKSPACE, {"workspace_id": workspace_id})


async def apply_member_limit(session: AsyncSession, workspace_id: int) -> MemberLimitResult:
    """Active members beyond ``member_limit`` are suspended, newest first; suspensions lift oldest first.

    Members are ordered by when they joined (Clerk's membership ``created_at``),
    so the same members keep their seats whatever order the events came in.
    Running it again changes nothing.
    """
    workspace = await lock_workspace(session, workspace_id)
    result = MemberLimitResult()
    if workspace is None:
        return result
    members = await session.scalars(_ACTIVE_MEMBERS, {"workspace_id": workspace_id})
    now = datetime.now(UTC)
    for position, member in enumerate(members):
        has_seat = position < workspace.member_limit
        if has_seat and member.suspended_at is not None:
            member.suspended_at = None
            result.restored.append(member.id)
        elif not has_seat and member.suspended_at is None:
            member.suspended_at = now
            result.suspended.append(member.id)
    await session.flush()
    return result
