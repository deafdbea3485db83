"""A workspace and its members: locks, seats, and the billing columns billing asks identity to write.

Every transaction that changes a workspace's members locks the workspace
first, so seats are decided under one row lock and two transactions never
deadlock. The billing columns (``stripe_customer_id``, the subscription's
state, ``billing_synced_at``) hold what billing read from Stripe: billing
decides their values (``app/billing``) and asks for them to be written
through ``app/identity/billing_state.py``; only this repository writes the
row, so every change of it is journaled.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import TextClause, func, or_, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from app.identity.models import AppUser, Workspace, WorkspaceMember
from app.identity.repository.clerk import ClerkModel, ClerkRows, MemberRows, UserRepository, returned
from app.identity.repository.journal_sql import journaled, run, state

_LOCK_WORKSPACE = text("SELECT id FROM workspace WHERE id = :workspace_id FOR UPDATE")
_LOCK_WORKSPACE_BY_ORG = text("SELECT id FROM workspace WHERE clerk_org_id = :clerk_org_id FOR UPDATE")
_LOCK_WORKSPACE_OF_CUSTOMER = text(
    "SELECT id, billing_synced_at FROM workspace WHERE stripe_customer_id = :customer_id FOR UPDATE"
)
_WORKSPACE_OF_CUSTOMER = text("SELECT id FROM workspace WHERE stripe_customer_id = :customer_id")
_WORKSPACE_STATE = state(cast(Any, Workspace.__table__), "t")


def _update_workspace(where: str, assignments: str) -> TextClause:
    """An update of one workspace row, locked first, journaled; returns its id when it wrote it."""
    return journaled(
        "workspace",
        f"""WITH old AS MATERIALIZED (
    SELECT t.id, {_WORKSPACE_STATE} AS state FROM workspace AS t WHERE t.id = :workspace_id AND {where} FOR UPDATE
), written AS (
    UPDATE workspace AS t SET {assignments} FROM old WHERE t.id = old.id
    RETURNING {returned(Workspace)}, old.state AS old_state
)""",
        "SELECT id, {journaled} FROM written",
    )


@functools.cache
def _set_member_limit_statement() -> TextClause:
    return _update_workspace("t.member_limit <> :limit", "member_limit = :limit")


@functools.cache
def _link_customer_statement() -> TextClause:
    return _update_workspace("true", "stripe_customer_id = :customer_id")


@functools.cache
def _write_billing_statement(columns: tuple[str, ...]) -> TextClause:
    assignments = ", ".join(f"{name} = :{name}" for name in columns)
    return _update_workspace(
        "(t.billing_synced_at IS NULL OR t.billing_synced_at <= :read_began)",
        f"{assignments}, billing_synced_at = :read_began",
    )


# One round trip: find the newest member who has a seat (the member_limit-th active member by join time; before
# everyone at a limit of 0, after everyone when fewer members), then suspend the active members after them and
# lift the suspensions up to them. Each part reads only what it may
# change, through the partial indexes of migration 0006: the seat holders up to the limit, the unsuspended
# members after it (usually the one who just joined), the suspended ones before it. So a membership event costs
# the same in an organization of 20 members or of 20,000 (ranking them all cost a bulk import O(n) per event).
# It reads the members with its own snapshot, so the caller must hold the workspace's row lock from an earlier
# statement: then it sees every change made under that lock (a restored member's stored suspension included,
# which its journal row names).
@functools.cache
def apply_member_limit_statement() -> TextClause:
    """Built on first use, as every statement here (so ``bench/without_journal.py`` can switch the journal off)."""
    return journaled(
        "workspace_member",
        """WITH seats AS (SELECT member_limit AS n FROM workspace WHERE id = :workspace_id),
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
    RETURNING m.id, false AS restored, m.workspace_id, jsonb_build_object('suspended_at', m.suspended_at) AS state,
              jsonb_build_object('suspended_at', NULL) AS old_state
),
restored AS (
    UPDATE workspace_member m SET suspended_at = NULL
    WHERE m.workspace_id = :workspace_id AND m.deleted_at IS NULL AND m.suspended_at IS NOT NULL
      AND (m.created_at, m.id) <= (SELECT created_at, id FROM last_seat)
    RETURNING m.id, true AS restored, m.workspace_id, jsonb_build_object('suspended_at', NULL) AS state,
              (SELECT jsonb_build_object('suspended_at', o.suspended_at) FROM workspace_member o WHERE o.id = m.id)
              AS old_state
),
written AS (SELECT * FROM suspended UNION ALL SELECT * FROM restored)""",
        "SELECT id, restored, {journaled} FROM written",
    )


@dataclass(frozen=True)
class MemberLimitResult:
    suspended: list[int] = field(default_factory=list)
    restored: list[int] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.suspended or self.restored)


@dataclass(frozen=True)
class WorkspaceSummary:
    """A workspace as an operator looks it up, or another module reads it: its keys, its plan, whether it is deleted."""

    id: int
    name: str | None
    clerk_org_id: str | None
    stripe_customer_id: str | None
    subscription_status: str | None
    seat_quantity: int | None
    member_limit: int
    deleted_at: datetime | None


_SUMMARY = (
    Workspace.id,
    Workspace.name,
    Workspace.clerk_org_id,
    Workspace.stripe_customer_id,
    Workspace.subscription_status,
    Workspace.seat_quantity,
    Workspace.member_limit,
    Workspace.deleted_at,
)
_MAX_BIGINT_DIGITS = 18
SEARCH_LIMIT = 50


class WorkspaceRepository(ClerkRows):
    """``workspace`` and its members."""

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
        return bool(
            await run(self.session, _set_member_limit_statement(), {"workspace_id": workspace_id, "limit": limit})
        )

    async def apply_member_limit(self, workspace_id: int) -> MemberLimitResult:
        """Suspend the active members past ``member_limit``, newest first; lift suspensions within it.

        The caller holds the workspace's row lock (:meth:`lock`).
        """
        changed = await run(self.session, apply_member_limit_statement(), {"workspace_id": workspace_id})
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

    # The billing columns, as billing asks (app/identity/billing_state.py) ----------------------------------
    async def lock_of_customer(self, customer_id: str) -> tuple[int, datetime | None] | None:
        """The customer's workspace, locked: its id and ``billing_synced_at``."""
        row = (await self.session.execute(_LOCK_WORKSPACE_OF_CUSTOMER, {"customer_id": customer_id})).first()
        return (int(row.id), row.billing_synced_at) if row is not None else None

    async def of_customer(self, customer_id: str) -> int | None:
        return cast("int | None", await self.session.scalar(_WORKSPACE_OF_CUSTOMER, {"customer_id": customer_id}))

    async def lock_by_key(self, *, workspace_id: int | None, clerk_org_id: str | None) -> tuple[int, str | None] | None:
        """The workspace (id, stripe_customer_id), locked, by its primary key or its Clerk organization id."""
        condition = Workspace.id == workspace_id if workspace_id is not None else Workspace.clerk_org_id == clerk_org_id
        query = select(Workspace.id, Workspace.stripe_customer_id).where(condition).with_for_update()
        row = (await self.session.execute(query)).first()
        return (int(row[0]), row[1]) if row is not None else None

    async def locked_billing(
        self, workspace_id: int, customer_id: str, columns: Sequence[str]
    ) -> dict[str, Any] | None:
        """These columns of the workspace, locked; None once it is unlinked from ``customer_id``."""
        query = (
            select(*(Workspace.__table__.c[name] for name in columns))
            .where(Workspace.id == workspace_id, Workspace.stripe_customer_id == customer_id)
            .with_for_update()
        )
        row = (await self.session.execute(query)).mappings().first()
        return dict(row) if row is not None else None

    async def write_billing(self, workspace_id: int, columns: Mapping[str, Any], read_began: datetime) -> bool:
        """Write what a read that began at ``read_began`` found, unless a later read was written already."""
        statement = _write_billing_statement(tuple(columns))
        values = {**columns, "workspace_id": workspace_id, "read_began": read_began}
        return bool(await run(self.session, statement, values))

    async def link_customer(self, workspace_id: int, customer_id: str) -> None:
        await run(self.session, _link_customer_statement(), {"workspace_id": workspace_id, "customer_id": customer_id})

    async def linked(self, *, every: bool, stale_hours: int) -> list[tuple[int, str]]:
        """Linked workspaces (id, customer) not synced for ``stale_hours`` (or all of them), by id."""
        query = select(Workspace.id, Workspace.stripe_customer_id).where(
            Workspace.stripe_customer_id.is_not(None), Workspace.deleted_at.is_(None)
        )
        if not every:
            stale_before = func.now() - timedelta(hours=stale_hours)
            query = query.where(or_(Workspace.billing_synced_at.is_(None), Workspace.billing_synced_at < stale_before))
        rows = (await self.session.execute(query.order_by(Workspace.id))).all()
        return [(int(row[0]), str(row[1])) for row in rows]

    # Other modules' reads (app/identity/directory.py) and operators' ----------------------------------------
    async def active_ids(self, *, after_id: int, limit: int) -> list[int]:
        """Up to ``limit`` ids of workspaces not deleted, above ``after_id``, in id order: a page of a walk."""
        query = (
            select(Workspace.id)
            .where(Workspace.deleted_at.is_(None), Workspace.id > after_id)
            .order_by(Workspace.id)
            .limit(limit)
        )
        return list((await self.session.scalars(query)).all())

    async def member_emails(self, workspace_id: int) -> list[str]:
        """The emails of the workspace's members (neither membership nor user deleted), case-insensitively sorted."""
        query = (
            select(AppUser.email)
            .join(WorkspaceMember, WorkspaceMember.user_id == AppUser.id)
            .where(
                WorkspaceMember.workspace_id == workspace_id,
                WorkspaceMember.deleted_at.is_(None),
                AppUser.deleted_at.is_(None),
                AppUser.email.is_not(None),
                AppUser.email != "",
            )
            .order_by(func.lower(AppUser.email))
        )
        return [str(email) for email in (await self.session.scalars(query)).all()]

    async def get(self, workspace_id: int) -> WorkspaceSummary | None:
        row = (await self.session.execute(select(*_SUMMARY).where(Workspace.id == workspace_id))).first()
        return WorkspaceSummary(*row) if row is not None else None

    async def find(self, query: str, *, by_name: bool = True) -> list[WorkspaceSummary]:
        """By row id, Clerk organization id or Stripe customer id (exactly), or (``by_name``) a part of its name."""
        query = query.strip()
        conditions = [Workspace.clerk_org_id == query, Workspace.stripe_customer_id == query]
        if query.isdigit() and len(query) <= _MAX_BIGINT_DIGITS:
            conditions.append(Workspace.id == int(query))
        if query and by_name:
            pattern = "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            conditions.append(Workspace.name.ilike(pattern))
        statement = select(*_SUMMARY).where(or_(*conditions)).order_by(Workspace.id).limit(SEARCH_LIMIT)
        return [WorkspaceSummary(*row) for row in (await self.session.execute(statement)).all()]


def clerk_rows(model: ClerkModel, session: AsyncSession) -> ClerkRows:
    """The repository of one kind of Clerk object (reconciliation walks every kind alike)."""
    repository: type[ClerkRows] = {AppUser: UserRepository, Workspace: WorkspaceRepository}.get(model, MemberRows)
    return repository(session)
