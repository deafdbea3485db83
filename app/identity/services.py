"""Identity's rules: Clerk's objects applied to our rows, whoever read them, and the seats of a workspace.

A webhook event carries an object (a user, an organization, a membership) as
``data``; Clerk's Backend API lists the same objects. Both go through
:class:`IdentityService`, so reconciliation applies exactly the ordering rules
the events do (``repository``: a change applies only if it is not older than
what is stored; a deletion is the newest change). ``source`` names where an
object came from, for the error message when a required field is missing.

Seats (:class:`SeatService`): a workspace's active members beyond its
``member_limit`` are suspended, newest first; suspensions lift oldest first as
the limit grows or members leave. Members are ordered by when they joined
(Clerk's membership ``created_at``), so the same members keep their seats
whatever order the events came in.

A service works in the session of the unit of work its caller opened (an
event's transaction, a page of reconciliation, a job) and never commits.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.settings import Settings
from app.identity.models import AppUser, Workspace, WorkspaceMember
from app.identity.repository import (
    ClerkChange,
    ClerkDeletion,
    ClerkModel,
    MemberLimitResult,
    UserRepository,
    WorkspaceRepository,
)
from app.queue.errors import PermanentError

logger = logging.getLogger(__name__)


def clerk_time(milliseconds: Any) -> datetime:
    """Clerk stamps times as unix milliseconds."""
    return datetime.fromtimestamp(int(milliseconds) / 1000, UTC)


def required(data: Mapping[str, Any], name: str, source: str) -> Any:
    value = data.get(name)
    if value is None:
        raise PermanentError(f"{source} has no {name!r}: it cannot be applied; check its payload.")
    return value


def primary_email(data: Mapping[str, Any]) -> str | None:
    primary = data.get("primary_email_address_id")
    for address in data.get("email_addresses") or []:
        if address.get("id") == primary and address.get("email_address") is not None:
            return str(address["email_address"])
    return None


def change(data: Mapping[str, Any], source: str, fields: dict[str, Any], **insert_only: Any) -> ClerkChange:
    """``created_at`` is Clerk's, so members keep their join order whatever order their events came in."""
    if data.get("created_at") is not None:
        fields["created_at"] = clerk_time(data["created_at"])
    key, updated_at = str(required(data, "id", source)), clerk_time(required(data, "updated_at", source))
    return ClerkChange(key=key, updated_at=updated_at, fields=fields, insert_only=insert_only)


class SeatService:
    """How many members a workspace may have (``member_limit``), and which members are suspended beyond it."""

    def __init__(self, session: AsyncSession) -> None:
        self.workspaces = WorkspaceRepository(session)

    async def apply_member_limit(self, workspace_id: int, *, locked: bool = False) -> MemberLimitResult:
        """Running it again changes nothing. ``locked``: this transaction already holds the workspace's row lock."""
        if not locked and not await self.workspaces.lock(workspace_id):
            return MemberLimitResult()
        return await self.workspaces.apply_member_limit(workspace_id)

    async def set_member_limit(self, workspace_id: int, limit: int) -> bool:
        """Give the workspace ``limit`` seats; whether that changed its limit (its members are not re-seated here)."""
        return await self.workspaces.set_member_limit(workspace_id, limit)

    async def reseat(self, workspace_id: int, limit: int) -> tuple[bool, MemberLimitResult]:
        """Give the workspace ``limit`` seats and re-seat its members now (this transaction holds the lock)."""
        changed = await self.workspaces.set_member_limit(workspace_id, limit)
        return changed, await self.apply_member_limit(workspace_id, locked=True)


class IdentityService:
    """Users, organizations (our workspaces) and memberships, as Clerk has them."""

    def __init__(self, session: AsyncSession, settings: Settings) -> None:
        self.settings = settings
        self.users = UserRepository(session)
        self.workspaces = WorkspaceRepository(session)
        self.seats = SeatService(session)

    async def apply_user(self, data: Mapping[str, Any], source: str) -> None:
        fields = {
            "email": primary_email(data),
            "first_name": data.get("first_name"),
            "last_name": data.get("last_name"),
        }
        await self.users.apply_change(change(data, source, fields))

    async def delete_user(self, key: str, deleted_at: datetime) -> None:
        await self.users.apply_deletion(ClerkDeletion(key, deleted_at))

    async def apply_organization(self, data: Mapping[str, Any], source: str) -> None:
        fields = {"name": data.get("name"), "slug": data.get("slug")}
        limit = self.settings.free_plan_member_limit
        await self.workspaces.apply_change(change(data, source, fields, member_limit=limit))

    async def delete_organization(self, key: str, deleted_at: datetime) -> None:
        limit = self.settings.free_plan_member_limit
        await self.workspaces.apply_deletion(ClerkDeletion(key, deleted_at, {"member_limit": limit}))

    async def apply_membership(
        self, data: Mapping[str, Any], source: str, *, deleted_at: datetime | None = None
    ) -> None:
        """A membership may arrive before its user or organization: it creates minimal rows from what it carries."""
        organization = required(data, "organization", source)
        user = required(data, "public_user_data", source)
        workspace_id = await self.workspaces.lock_or_insert(
            str(required(organization, "id", source)),
            name=organization.get("name"),
            slug=organization.get("slug"),
            member_limit=self.settings.free_plan_member_limit,
        )
        user_id = await self.users.ensure(
            str(required(user, "user_id", source)), first_name=user.get("first_name"), last_name=user.get("last_name")
        )
        links = {"role": data.get("role"), "workspace_id": workspace_id, "user_id": user_id}
        if deleted_at is not None:
            key = str(required(data, "id", source))
            await self.workspaces.members.apply_deletion(ClerkDeletion(key, deleted_at, links))
        else:
            await self.workspaces.members.apply_change(change(data, source, links))
        await self.reassign_seats(workspace_id)

    async def reassign_seats(self, workspace_id: int) -> None:
        """A member joining a full workspace is suspended at once; one leaving frees a seat for the oldest suspended.

        The caller holds the workspace's row lock.
        """
        if not self.settings.stripe_enabled:  # without billing, no plan limits a workspace's members
            return
        result = await self.seats.apply_member_limit(workspace_id, locked=True)
        if result.changed:
            logger.info(
                "Workspace %s: seats reassigned after a membership change (suspended %s, restored %s).",
                workspace_id,
                result.suspended,
                result.restored,
            )

    async def delete_gone(self, model: ClerkModel, keys: Sequence[str]) -> None:
        """Soft-delete rows whose Clerk object is gone; a membership's workspace is re-seated (a seat was freed).

        The workspaces are locked first, in id order: no deadlock with a concurrent run or event.
        """
        workspaces = await self.workspaces.workspaces_of_members(keys) if model is WorkspaceMember else []
        for workspace_id in workspaces:
            await self.workspaces.lock(workspace_id)
        rows = {AppUser: self.users, Workspace: self.workspaces}.get(model, self.workspaces.members)
        await rows.delete_now(keys)
        for workspace_id in workspaces:
            await self.reassign_seats(workspace_id)
