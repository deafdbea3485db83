"""Seats: how many members a workspace may have, and which members are suspended beyond that.

Identity owns them: the workspace's ``member_limit``, each member's
``suspended_at``, and ``ApplyWorkspaceMemberLimitJob``. Billing only says how
many seats are paid for, through :func:`set_member_limit` (the seat
quantity of the current subscription, else ``FREE_PLAN_MEMBER_LIMIT``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import msgspec
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.resources import MessageQueue
from app.identity.services import lock_workspace
from app.queue.job import Job
from app.queue.queues import QueueName

logger = logging.getLogger(__name__)

_SET_LIMIT = text(
    "UPDATE workspace SET member_limit = :limit WHERE id = :workspace_id AND member_limit <> :limit RETURNING id"
)


@dataclass(frozen=True)
class MemberLimitResult:
    suspended: list[int] = field(default_factory=list)
    restored: list[int] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.suspended or self.restored)


# One round trip: rank the active members by join time, then suspend those past the limit and lift
# suspensions within it. It reads the members with its own snapshot, so the caller must hold the
# workspace's row lock from an earlier statement: then it sees every change made under that lock.
_APPLY_MEMBER_LIMIT = text(
    """
WITH ranked AS (
    SELECT m.id, m.suspended_at IS NOT NULL AS suspended,
           row_number() OVER (ORDER BY m.created_at, m.id) <= w.member_limit AS has_seat
    FROM workspace_member m JOIN workspace w ON w.id = m.workspace_id
    WHERE m.workspace_id = :workspace_id AND m.deleted_at IS NULL
)
UPDATE workspace_member m
SET suspended_at = CASE WHEN ranked.has_seat THEN NULL ELSE now() END
FROM ranked
WHERE m.id = ranked.id AND ranked.has_seat = ranked.suspended
RETURNING m.id, m.suspended_at IS NULL AS restored
"""
)


class ApplyWorkspaceMemberLimitData(msgspec.Struct, frozen=True):
    workspace_id: int


class ApplyWorkspaceMemberLimitJob(Job[ApplyWorkspaceMemberLimitData]):
    """Suspend the newest active members beyond the workspace's limit; lift suspensions, oldest first, as it grows.

    Staged by :func:`set_member_limit` when the limit changed. It reads the limit when it
    runs (under the workspace's row lock), not from its data, so a late or
    repeated run applies the current limit and a second run changes nothing.
    """

    queue = QueueName.BILLING
    # A few statements under one row lock. The timeout also bounds how long a run lost with its worker (SIGKILL,
    # or a Redis restart while it ran) waits to run again: with the 300 s default, seats stayed unenforced ~5 min.
    timeout_seconds = 30

    async def handle(self, data: ApplyWorkspaceMemberLimitData) -> None:
        async with self.resources.db.session() as session:
            result = await apply_member_limit(session, data.workspace_id)
            await session.commit()
        if result.changed:
            logger.info(
                "Workspace %s member limit applied: suspended members %s, restored members %s.",
                data.workspace_id,
                result.suspended,
                result.restored,
            )


async def set_member_limit(
    session: AsyncSession, queue: MessageQueue, workspace_id: int, limit: int, *, cause: str
) -> bool:
    """Give the workspace ``limit`` seats; if that changes its limit, its members are re-seated after the commit.

    The job is staged in ``session``'s transaction (queued exactly when the new
    limit commits), once per ``cause`` (the event or run that changed it): never
    folded into a job that already read the old limit. Returns whether it changed.
    """
    changed = await session.scalar(_SET_LIMIT, {"workspace_id": workspace_id, "limit": limit})
    if changed is None:
        return False
    await queue.add(
        ApplyWorkspaceMemberLimitJob,
        ApplyWorkspaceMemberLimitData(workspace_id=workspace_id),
        deduplication_id=f"member-limit:{workspace_id}:{cause}",
        session=session,
    )
    return True


async def apply_member_limit(session: AsyncSession, workspace_id: int, *, locked: bool = False) -> MemberLimitResult:
    """Active members beyond ``member_limit`` are suspended, newest first; suspensions lift oldest first.

    Members are ordered by when they joined (Clerk's membership ``created_at``),
    so the same members keep their seats whatever order the events came in.
    Running it again changes nothing. ``locked``: this transaction already
    holds the workspace's row lock.
    """
    if not locked and not await lock_workspace(session, workspace_id):
        return MemberLimitResult()
    changed = (await session.execute(_APPLY_MEMBER_LIMIT, {"workspace_id": workspace_id})).all()
    return MemberLimitResult(
        suspended=sorted(row.id for row in changed if not row.restored),
        restored=sorted(row.id for row in changed if row.restored),
    )


async def reseat(session: AsyncSession, workspace_id: int, limit: int) -> tuple[bool, MemberLimitResult]:
    """Give the workspace ``limit`` seats and re-seat its members now, in this transaction (it holds the lock).

    For reconciliation: whether the limit changed, and whom that (or drift
    from a lost job) suspended or restored.
    """
    changed = await session.scalar(_SET_LIMIT, {"workspace_id": workspace_id, "limit": limit}) is not None
    return changed, await apply_member_limit(session, workspace_id, locked=True)
