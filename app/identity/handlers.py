"""Clerk events (``user.*``, ``organization.*``, ``organizationMembership.*``) mapped to our rows.

Each handler turns the event into a :class:`ClerkChange` or a
:class:`ClerkDeletion` and lets the services apply it; the ordering rules live
there. A change's version is the object's ``updated_at``; a deletion's time is
the payload's top-level ``timestamp`` (deleted objects carry no ``updated_at``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

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
from app.webhooks.handlers import EventRoutes, WebhookContext

logger = logging.getLogger(__name__)


def _required(data: Mapping[str, Any], name: str, event_type: str) -> Any:
    value = data.get(name)
    if value is None:
        raise PermanentError(f"Clerk {event_type} event has no {name!r}: it cannot be applied; check its payload.")
    return value


def _change(data: Mapping[str, Any], event_type: str, fields: dict[str, Any], **insert_only: Any) -> ClerkChange:
    """``created_at`` is Clerk's, so members keep their join order whatever order their events came in."""
    if data.get("created_at") is not None:
        fields["created_at"] = clerk_time(data["created_at"])
    key, updated_at = str(_required(data, "id", event_type)), clerk_time(_required(data, "updated_at", event_type))
    return ClerkChange(key=key, updated_at=updated_at, fields=fields, insert_only=insert_only)


def _deletion(context: WebhookContext, **insert_only: Any) -> ClerkDeletion:
    event_type = context.event.type
    deleted_at = clerk_time(_required(context.payload, "timestamp", event_type))
    key = str(_required(context.payload["data"], "id", event_type))
    return ClerkDeletion(key=key, deleted_at=deleted_at, insert_only=insert_only)


def _primary_email(data: Mapping[str, Any]) -> str | None:
    primary = data.get("primary_email_address_id")
    for address in data.get("email_addresses") or []:
        if address.get("id") == primary:
            return str(address["email_address"])
    return None


async def _user(context: WebhookContext, action: str) -> None:
    data = context.payload["data"]
    if action == "deleted":
        await apply_deletion(context.session, AppUser, _deletion(context))
        return
    fields = {"email": _primary_email(data), "first_name": data.get("first_name"), "last_name": data.get("last_name")}
    await apply_change(context.session, AppUser, _change(data, context.event.type, fields))


async def _organization(context: WebhookContext, action: str) -> None:
    data = context.payload["data"]
    new_workspace = {"member_limit": context.resources.settings.free_plan_member_limit}
    if action == "deleted":
        await apply_deletion(context.session, Workspace, _deletion(context, **new_workspace))
        return
    fields = {"name": data.get("name"), "slug": data.get("slug")}
    await apply_change(context.session, Workspace, _change(data, context.event.type, fields, **new_workspace))


async def _membership(context: WebhookContext, action: str) -> None:
    """A membership may arrive before its user or organization: it creates minimal rows from what it carries."""
    session, data, event_type = context.session, context.payload["data"], context.event.type
    organization = _required(data, "organization", event_type)
    user = _required(data, "public_user_data", event_type)
    workspace_id = await ensure_locked_workspace(
        session,
        str(_required(organization, "id", event_type)),
        name=organization.get("name"),
        slug=organization.get("slug"),
        member_limit=context.resources.settings.free_plan_member_limit,
    )
    user_id = await ensure_row(
        session,
        AppUser,
        str(_required(user, "user_id", event_type)),
        first_name=user.get("first_name"),
        last_name=user.get("last_name"),
    )
    links = {"workspace_id": workspace_id, "user_id": user_id}
    if action == "deleted":
        await apply_deletion(session, WorkspaceMember, _deletion(context, role=data.get("role"), **links))
    else:
        change = _change(data, event_type, {"role": data.get("role"), **links})
        await apply_change(session, WorkspaceMember, change)
    await _reassign_seats(context, workspace_id)


async def _reassign_seats(context: WebhookContext, workspace_id: int) -> None:
    """A member joining a full workspace is suspended at once; one leaving frees a seat for the oldest suspended."""
    if not context.resources.settings.stripe_enabled:  # without billing, no plan limits a workspace's members
        return
    result = await apply_member_limit(context.session, workspace_id, locked=True)
    if result.changed:
        logger.info(
            "Workspace %s: seats reassigned after a membership change (suspended %s, restored %s).",
            workspace_id,
            result.suspended,
            result.restored,
        )


def _by_action(apply: Callable[[WebhookContext, str], Awaitable[None]]) -> Callable[[WebhookContext], Awaitable[None]]:
    async def handle(context: WebhookContext) -> None:
        action = context.event.type.partition(".")[2]
        if action not in ("created", "updated", "deleted"):
            logger.info("Clerk %s event %s: nothing to apply.", context.event.type, context.event.event_id)
            return
        await apply(context, action)

    return handle


# SPEC section 11's list: the Clerk events identity handles, and so the ones the intake stores.
CLERK_EVENTS = EventRoutes(
    {
        "user.*": _by_action(_user),
        "organization.*": _by_action(_organization),
        "organizationMembership.*": _by_action(_membership),
    }
)
