"""Clerk events (``user.*``, ``organization.*``, ``organizationMembership.*``) mapped to our rows.

Each handler hands the event's object to ``clerk_sync`` (which reconciliation
uses too) or turns the event into a :class:`ClerkDeletion`; the ordering rules
live in ``services``. A change's version is the object's ``updated_at``; a deletion's time is
the payload's top-level ``timestamp`` (deleted objects carry no ``updated_at``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from app.identity.clerk_sync import apply_membership, apply_organization, apply_user, required
from app.identity.models import AppUser, Workspace
from app.identity.services import ClerkDeletion, apply_deletion, clerk_time
from app.webhooks.handlers import EventRoutes, WebhookContext

logger = logging.getLogger(__name__)


def _source(context: WebhookContext) -> str:
    return f"Clerk {context.event.type} event"


def _deletion(context: WebhookContext, **insert_only: Any) -> ClerkDeletion:
    source = _source(context)
    deleted_at = clerk_time(required(context.payload, "timestamp", source))
    key = str(required(context.payload["data"], "id", source))
    return ClerkDeletion(key=key, deleted_at=deleted_at, insert_only=insert_only)


async def _user(context: WebhookContext, action: str) -> None:
    if action == "deleted":
        await apply_deletion(context.session, AppUser, _deletion(context))
    else:
        await apply_user(context.session, context.payload["data"], _source(context))


async def _organization(context: WebhookContext, action: str) -> None:
    settings = context.resources.settings
    if action == "deleted":
        await apply_deletion(
            context.session, Workspace, _deletion(context, member_limit=settings.free_plan_member_limit)
        )
    else:
        await apply_organization(context.session, context.payload["data"], _source(context), settings)


async def _membership(context: WebhookContext, action: str) -> None:
    source = _source(context)
    deleted_at = clerk_time(required(context.payload, "timestamp", source)) if action == "deleted" else None
    await apply_membership(
        context.session, context.payload["data"], source, context.resources.settings, deleted_at=deleted_at
    )


def _by_action(apply: Callable[[WebhookContext, str], Awaitable[None]]) -> Callable[[WebhookContext], Awaitable[None]]:
    async def handle(context: WebhookContext) -> None:
        action = context.event.type.partition(".")[2]
        if action not in ("created", "updated", "deleted"):
            logger.info("Clerk %s event %s: nothing to apply.", context.event.type, context.event.event_id)
            return
        await apply(context, action)

    return handle


# The Clerk events identity handles (docs/deploy.md lists them to subscribe to), and so the ones the intake stores.
CLERK_EVENTS = EventRoutes(
    {
        "user.*": _by_action(_user),
        "organization.*": _by_action(_organization),
        "organizationMembership.*": _by_action(_membership),
    }
)
