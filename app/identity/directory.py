"""Workspaces and their members, as other modules read them: plain values, never identity's models.

Identity owns ``workspace``, ``app_user`` and ``workspace_member``; a module
that needs to know who is in a workspace, or which workspaces there are, asks
here instead of querying those tables (the worked example, ``app/clients``,
does). Identity can then change its tables, or what "a member" means, in one
place. Each function reads in the caller's session.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from app.identity.repository import WorkspaceRepository, WorkspaceSummary

__all__ = ["WorkspaceSummary", "active_workspace", "active_workspace_ids", "member_emails"]


async def active_workspace(session: AsyncSession, workspace_id: int) -> WorkspaceSummary | None:
    """The workspace's name, plan and member limit; None when it does not exist or is deleted."""
    workspace = await WorkspaceRepository(session).get(workspace_id)
    return workspace if workspace is not None and workspace.deleted_at is None else None


async def active_workspace_ids(session: AsyncSession, *, after_id: int = 0, limit: int) -> list[int]:
    """A page of the workspaces not deleted: up to ``limit`` ids above ``after_id``, in id order. Walk them all by
    passing the page's last id as the next ``after_id``, until a page comes back empty."""
    return await WorkspaceRepository(session).active_ids(after_id=after_id, limit=limit)


async def member_emails(session: AsyncSession, workspace_id: int) -> tuple[str, ...]:
    """The emails of the workspace's members, sorted case-insensitively; a member without one is left out, as is a
    deleted member or user (a suspended member, beyond the paid seats, is still a member)."""
    return tuple(await WorkspaceRepository(session).member_emails(workspace_id))
