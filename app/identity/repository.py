"""Every statement on identity's tables: ``app_user``, ``workspace`` (all but billing's columns) and its members.

Users are one aggregate (:class:`UserRepository`); a workspace and its members
are another (:class:`WorkspaceRepository`): every transaction that changes a
workspace's members locks the workspace first, so seats are decided under one
row lock and two transactions never deadlock. A repository runs its statements
in the caller's session and never commits: the caller's transaction decides.

Clerk's objects are written so that in any order the newest wins and repeats
are safe. Every write is one ``INSERT ... ON CONFLICT`` on the Clerk id, so
concurrent first sightings of one object cannot collide, and these rules decide
what a late, early or repeated event does:

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

from sqlalchemy import ColumnElement, CompoundSelect, Table, and_, bindparam, func, or_, select, text, update
from sqlalchemy.dialects.postgresql import Insert, insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.identity.models import AppUser, Workspace, WorkspaceMember

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


@dataclass(frozen=True)
class MemberLimitResult:
    suspended: list[int] = field(default_factory=list)
    restored: list[int] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.suspended or self.restored)


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
def _ensure_statement(model: ClerkModel, columns: tuple[str, ...]) -> CompoundSelect:
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


class ClerkRows:
    """The statements every table copied from Clerk shares, on the subclass's ``model``."""

    model: ClassVar[ClerkModel]

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def apply_change(self, change: ClerkChange) -> None:
        row = {key_column(self.model): change.key, **change.fields, "clerk_updated_at": change.updated_at}
        statement = _change_statement(self.model, tuple(row), tuple(change.insert_only))
        await self.session.execute(statement, {**row, **change.insert_only})

    async def apply_deletion(self, deletion: ClerkDeletion) -> None:
        statement = _deletion_statement(self.model, tuple(deletion.insert_only))
        values = {key_column(self.model): deletion.key, "deleted_at": deletion.deleted_at, **deletion.insert_only}
        await self.session.execute(statement, values)

    async def ensure(self, key: str, **fields: Any) -> int:
        """The row's id, inserting a minimal row (no ``clerk_updated_at``) if Clerk's own event has not come yet.

        An existing row, deleted or not, is left as it is (``ON CONFLICT DO NOTHING``).
        """
        column = key_column(self.model)
        values = {column: key, **fields}
        row_id = await self.session.scalar(_ensure_statement(self.model, tuple(values)), {**values, "lookup_key": key})
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
        key = getattr(self.model, key_column(self.model))
        statement = update(self.model).where(key.in_(keys), self.model.deleted_at.is_(None))
        await self.session.execute(statement.values(deleted_at=func.now()))


class UserRepository(ClerkRows):
    """``app_user``."""

    model = AppUser


class MemberRows(ClerkRows):
    """``workspace_member``, reached through :attr:`WorkspaceRepository.members`."""

    model = WorkspaceMember


_LOCK_WORKSPACE = text("SELECT id FROM workspace WHERE id = :workspace_id FOR UPDATE")
_LOCK_WORKSPACE_BY_ORG = text("SELECT id FROM workspace WHERE clerk_org_id = :clerk_org_id FOR UPDATE")
_SET_MEMBER_LIMIT = text(
    "UPDATE workspace SET member_limit = :limit WHERE id = :workspace_id AND member_limit <> :limit RETURNING id"
)
# One round trip: find the newest member who has a seat (the member_limit-th active member by join time; before
# everyone at a limit of 0, after everyone when fewer members), then suspend the active members after them and
# lift the suspensions up to them. Each part reads only what it may
# change, through the partial indexes of migration 0006: the seat holders up to the limit, the unsuspended
# members after it (usually the one who just joined), the suspended ones before it. So a membership event costs
# the same in an organization of 20 members or of 20,000 (ranking them all cost a bulk import O(n) per event).
# It reads the members with its own snapshot, so the caller must hold the workspace's row lock from an earlier
# statement: then it sees every change made under that lock.
_APPLY_MEMBER_LIMIT = text(
    """
WITH seats AS (SELECT member_limit AS n FROM workspace WHERE id = :workspace_id),
nth AS (
    SELECT m.created_at, m.id FROM workspace_member m
    WHERE m.workspace_id = :workspace_id AND m.deleted_at IS NULL
    ORDER BY m.created_at, m.id
    OFFSET (SELECT greatest(n - 1, 0) FROM seats) LIMIT 1
),
last_seat AS (
    SELECT CASE WHEN n <= 0 THEN '-infinity' ELSE coalesce((SELECT created_at FROM nth), 'infinity') END
               ::timestamptz AS created_at,
           CASE WHEN n <= 0 THEN 0 ELSE coalesce((SELECT id FROM nth), 0) END AS id
    FROM seats
),
suspended AS (
    UPDATE workspace_member m SET suspended_at = now()
    WHERE m.workspace_id = :workspace_id AND m.deleted_at IS NULL AND m.suspended_at IS NULL
      AND (m.created_at, m.id) > (SELECT created_at, id FROM last_seat)
    RETURNING m.id, false AS restored
),
restored AS (
    UPDATE workspace_member m SET suspended_at = NULL
    WHERE m.workspace_id = :workspace_id AND m.deleted_at IS NULL AND m.suspended_at IS NOT NULL
      AND (m.created_at, m.id) <= (SELECT created_at, id FROM last_seat)
    RETURNING m.id, true AS restored
)
SELECT id, restored FROM suspended UNION ALL SELECT id, restored FROM restored
"""
)


class WorkspaceRepository(ClerkRows):
    """``workspace`` (identity's columns and ``member_limit``; billing's are billing's) and its members."""

    model = Workspace

    def __init__(self, session: AsyncSession) -> None:
        super().__init__(session)
        self.members = MemberRows(session)

    async def lock(self, workspace_id: int) -> bool:
        """The workspace's row lock, until the transaction ends; whether the workspace exists."""
        return await self.session.scalar(_LOCK_WORKSPACE, {"workspace_id": workspace_id}) is not None

    async def lock_or_insert(self, clerk_org_id: str, **fields: Any) -> int:
        """The id of the organization's workspace, locked; a minimal row is inserted if Clerk's event has not come yet.

        One round trip when the workspace exists, the usual case.
        """
        workspace_id = await self.session.scalar(_LOCK_WORKSPACE_BY_ORG, {"clerk_org_id": clerk_org_id})
        if workspace_id is None:
            workspace_id = await self.ensure(clerk_org_id, **fields)
            await self.lock(workspace_id)  # a concurrent first sighting may have inserted it
        return int(workspace_id)

    async def set_member_limit(self, workspace_id: int, limit: int) -> bool:
        """Whether the limit changed (an equal one writes nothing)."""
        values = {"workspace_id": workspace_id, "limit": limit}
        return await self.session.scalar(_SET_MEMBER_LIMIT, values) is not None

    async def apply_member_limit(self, workspace_id: int) -> MemberLimitResult:
        """Suspend the active members past ``member_limit``, newest first; lift suspensions within it.

        The caller holds the workspace's row lock (:meth:`lock`).
        """
        changed = (await self.session.execute(_APPLY_MEMBER_LIMIT, {"workspace_id": workspace_id})).all()
        return MemberLimitResult(
            suspended=sorted(row.id for row in changed if not row.restored),
            restored=sorted(row.id for row in changed if row.restored),
        )

    async def workspaces_of_members(self, membership_keys: Sequence[str]) -> list[int]:
        """The workspaces these memberships (Clerk ids) belong to, in id order: the order they are locked in."""
        query = select(WorkspaceMember.workspace_id).where(WorkspaceMember.clerk_membership_id.in_(membership_keys))
        return sorted(set((await self.session.scalars(query.distinct())).all()))

    async def membership_links(self, membership_keys: Sequence[str]) -> dict[str, tuple[str | None, str]]:
        """Each membership's Clerk organization id (None for a workspace made here) and Clerk user id."""
        query = (
            select(WorkspaceMember.clerk_membership_id, Workspace.clerk_org_id, AppUser.clerk_user_id)
            .join(Workspace, Workspace.id == WorkspaceMember.workspace_id)
            .join(AppUser, AppUser.id == WorkspaceMember.user_id)
            .where(WorkspaceMember.clerk_membership_id.in_(membership_keys))
        )
        return {str(row[0]): (row[1], row[2]) for row in (await self.session.execute(query)).all()}


def clerk_rows(model: ClerkModel, session: AsyncSession) -> ClerkRows:
    """The repository of one kind of Clerk object (reconciliation walks every kind alike)."""
    repository: type[ClerkRows] = {AppUser: UserRepository, Workspace: WorkspaceRepository}.get(model, MemberRows)
    return repository(session)
