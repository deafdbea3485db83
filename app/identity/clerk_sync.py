"""Clerk's objects (a user, an organization, a membership) applied to our rows, whoever read them.

A webhook event carries an object as ``data``; the Backend API lists the same
objects. Both go through these functions, so reconciliation applies exactly
the ordering rules the events do (``services``: a change applies only if it
is not older than what is stored; a deletion is the newest change).
``source`` names where the object came from, for the error message when a
required field is missing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.settings import Settings
from app.identity.models import AppUser, Workspace, WorkspaceMember
from app.identity.seats import apply_member_limit
from app.identity.services import (
    ClerkChange,
    ClerkDeletion,
    apply_change,
    apply_deletion,
    clerk_time,
    ensure_locked_workspace,
    ensure_row,
)
from app.queue.errors import PermanentError

logger = logging.getLogger(__name__)


def required(data: Mapping[str, Any], name: str, source: str) -> Any:
    value = data.get(name)
    if value is None:
        raise PermanentError(f"{source} has no {name!r}: it cannot be applied; check its payload.")
    return value


def change(data: Mapping[str, Any], source: str, fields: dict[str, Any], **insert_only: Any) -> ClerkChange:
    """``created_at`` is Clerk's, so members keep their join order whatever order their events came in."""
    if data.get("created_at") is not None:
        fields["created_at"] = clerk_time(data["created_at"])
    key, updated_at = str(required(data, "id", source)), clerk_time(required(data, "updated_at", source))
    return ClerkChange(key=key, updated_at=updated_at, fields=fields, insert_only=insert_only)


def primary_email(data: Mapping[str, Any]) -> str | None:
    primary = data.get("primary_email_address_id")
    for address in data.get("email_addresses") or []:
        if address.get("id") == primary:
            return str(address["email_address"])
    return None


async def apply_user(session: AsyncSession, data: Mapping[str, Any], source: str) -> None:
    fields = {"email": primary_email(data), "first_name": data.get("first_name"), "last_name": data.get("last_name")}
    await apply_change(session, AppUser, change(data, source, fields))


async def apply_organization(session: AsyncSession, data: Mapping[str, Any], source: str, settings: Settings) -> None:
    fields = {"name": data.get("name"), "slug": data.get("slug")}
    await apply_change(session, Workspace, change(data, source, fields, member_limit=settings.free_plan_member_limit))


async def apply_membership(
    session: AsyncSession, data: Mapping[str, Any], source: str, settings: Settings, *, deleted_at: datetime | None
) -> None:
    """A membership may arrive before its user or organization: it creates minimal rows from what it carries."""
    organization = required(data, "organization", source)
    user = required(data, "public_user_data", source)
    workspace_id = await ensure_locked_workspace(
        session,
        str(required(organization, "id", source)),
        name=organization.get("name"),
        slug=organization.get("slug"),
        member_limit=settings.free_plan_member_limit,
    )
    user_id = await ensure_row(
        session,
        AppUser,
        str(required(user, "user_id", source)),
        first_name=user.get("first_name"),
        last_name=user.get("last_name"),
    )
    links = {"workspace_id": workspace_id, "user_id": user_id}
    if deleted_at is not None:
        key = str(required(data, "id", source))
        await apply_deletion(
            session, WorkspaceMember, ClerkDeletion(key, deleted_at, {"role": data.get("role"), **links})
        )
    else:
        await apply_change(session, WorkspaceMember, change(data, source, {"role": data.get("role"), **links}))
    await reassign_seats(session, settings, workspace_id)


async def reassign_seats(session: AsyncSession, settings: Settings, workspace_id: int) -> None:
    """A member joining a full workspace is suspended at once; one leaving frees a seat for the oldest suspended."""
    if not settings.stripe_enabled:  # without billing, no plan limits a workspace's members
        return
    result = await apply_member_limit(session, workspace_id, locked=True)
    if result.changed:
        logger.info(
            "Workspace %s: seats reassigned after a membership change (suspended %s, restored %s).",
            workspace_id,
            result.suspended,
            result.restored,
        )
