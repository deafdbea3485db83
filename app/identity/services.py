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

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.dialects.postgresql import insert
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


async def apply_change(session: AsyncSession, model: ClerkModel, change: ClerkChange) -> None:
    key = _key_column(model)
    row = {key: change.key, **change.fields, "clerk_updated_at": change.updated_at}
    statement = insert(model).values(**row, **change.insert_only)
    table = model.__table__
    await session.execute(
        statement.on_conflict_do_update(
            index_elements=[key],
            set_={name: statement.excluded[name] for name in row if name != key},
            where=or_(
                table.c.clerk_updated_at.is_(None),
                table.c.clerk_updated_at < statement.excluded.clerk_updated_at,
            ),
        )
    )


async def apply_deletion(session: AsyncSession, model: ClerkModel, deletion: ClerkDeletion) -> None:
    key = _key_column(model)
    statement = insert(model).values({key: deletion.key, "deleted_at": deletion.deleted_at, **deletion.insert_only})
    table = model.__table__
    # LEAST ignores NULL in Postgres: the first deletion stamps it, a repeat keeps the earliest time.
    await session.execute(
        statement.on_conflict_do_update(
            index_elements=[key],
            set_={"deleted_at": func.least(table.c.deleted_at, statement.excluded.deleted_at)},
        )
    )


async def ensure_row(session: AsyncSession, model: type[AppUser] | type[Workspace], key: str, **fields: Any) -> int:
    """The row's id, inserting a minimal row (no ``clerk_updated_at``) if Clerk's own event has not come yet."""
    key_column = _key_column(model)
    await session.execute(
        insert(model).values({key_column: key, **fields}).on_conflict_do_nothing(index_elements=[key_column])
    )
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


async def lock_workspace(session: AsyncSession, workspace_id: int) -> Workspace | None:
    """Every transaction that changes a workspace's members locks the workspace first (no deadlocks)."""
    return await session.scalar(select(Workspace).where(Workspace.id == workspace_id).with_for_update())


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
    members = await session.scalars(
        select(WorkspaceMember)
        .where(WorkspaceMember.workspace_id == workspace_id, WorkspaceMember.deleted_at.is_(None))
        .order_by(WorkspaceMember.created_at, WorkspaceMember.id)
    )
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
