"""Seats, as other modules ask for them: billing says how many seats are paid for, identity applies them.

Identity owns seats: the workspace's ``member_limit``, each member's
``suspended_at``, and the rules (``services.SeatService``). Billing only says
how many seats are paid for (the seat quantity of the current subscription,
else ``FREE_PLAN_MEMBER_LIMIT``), through these two functions.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.resources import MessageQueue
from app.identity.jobs import ApplyWorkspaceMemberLimitData, ApplyWorkspaceMemberLimitJob
from app.identity.repository import MemberLimitResult
from app.identity.services import SeatService

__all__ = [
    "ApplyWorkspaceMemberLimitData",
    "ApplyWorkspaceMemberLimitJob",
    "MemberLimitResult",
    "member_limit_job_id",
    "reseat",
    "set_member_limit",
]


async def set_member_limit(
    session: AsyncSession, queue: MessageQueue, workspace_id: int, limit: int, *, cause: str
) -> bool:
    """Give the workspace ``limit`` seats; if that changes its limit, its members are re-seated after the commit.

    The job is staged in ``session``'s transaction (queued exactly when the new
    limit commits), once per ``cause`` (the event or run that changed it): never
    folded into a job that already read the old limit. Returns whether it changed.
    """
    if not await SeatService(session).set_member_limit(workspace_id, limit):
        return False
    await queue.add(
        ApplyWorkspaceMemberLimitJob,
        ApplyWorkspaceMemberLimitData(workspace_id=workspace_id),
        deduplication_id=member_limit_job_id(workspace_id, cause),
        session=session,
    )
    return True


def member_limit_job_id(workspace_id: int, cause: str) -> str:
    """The member-limit job ``set_member_limit`` staged for ``cause``: an operator can ask whether it still waits."""
    return f"member-limit:{workspace_id}:{cause}"


async def reseat(session: AsyncSession, workspace_id: int, limit: int) -> tuple[bool, MemberLimitResult]:
    """Give the workspace ``limit`` seats and re-seat its members now, in this transaction (it holds the lock).

    For reconciliation: whether the limit changed, and whom that (or drift
    from a lost job) suspended or restored.
    """
    return await SeatService(session).reseat(workspace_id, limit)
