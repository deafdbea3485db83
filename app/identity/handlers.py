"""Clerk events (``user.*``, ``organization.*``, ``organizationMembership.*``) handed to ``IdentityService``.

Each handler runs in the event's transaction and hands the event's object to
the service (which reconciliation uses too), or its deletion. A change's
version is the object's ``updated_at``; a deletion's time is the payload's
top-level ``timestamp`` (deleted objects carry no ``updated_at``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any

from app.identity.services import IdentityService, clerk_time, required
from app.queue.errors import PermanentError
from app.webhooks.handlers import EventRoutes, WebhookContext

logger = logging.getLogger(__name__)
Apply = Callable[[IdentityService, WebhookContext, str], Awaitable[None]]


def _source(context: WebhookContext) -> str:
    return f"Clerk {context.event.type} event"


def _deleted_at(context: WebhookContext) -> datetime:
    return clerk_time(required(context.payload, "timestamp", _source(context)))


def _data(context: WebhookContext) -> Mapping[str, Any]:
    """The event's object; a body without one is set aside at once: retrying cannot give it one."""
    data = required(context.payload, "data", _source(context))
    if not isinstance(data, Mapping):
        raise PermanentError(f"{_source(context)} has a 'data' that is not an object: it cannot be applied.")
    return data


def _key(context: WebhookContext) -> str:
    return str(required(_data(context), "id", _source(context)))


async def _user(identity: IdentityService, context: WebhookContext, action: str) -> None:
    if action == "deleted":
        await identity.delete_user(_key(context), _deleted_at(context))
    else:
        await identity.apply_user(_data(context), _source(context))


async def _organization(identity: IdentityService, context: WebhookContext, action: str) -> None:
    if action == "deleted":
        await identity.delete_organization(_key(context), _deleted_at(context))
    else:
        await identity.apply_organization(_data(context), _source(context))


async def _membership(identity: IdentityService, context: WebhookContext, action: str) -> None:
    deleted_at = _deleted_at(context) if action == "deleted" else None
    await identity.apply_membership(_data(context), _source(context), deleted_at=deleted_at)


def _by_action(apply: Apply) -> Callable[[WebhookContext], Awaitable[None]]:
    async def handle(context: WebhookContext) -> None:
        action = context.event.type.partition(".")[2]
        if action not in ("created", "updated", "deleted"):
            logger.info("Clerk %s event %s: nothing to apply.", context.event.type, context.event.event_id)
            return
        await apply(IdentityService(context.session, context.resources.settings), context, action)

    return handle


MAX_KEY_CHARS = 200


def clerk_tenant(event_type: str, payload: Mapping[str, Any]) -> str | None:
    """Whose event it is: the organization of an organization or membership event, else the user it is about.

    One organization's bulk import of members then takes its turns in the Clerk
    queue, and another organization's events, or a user's, are not held up behind it.
    """
    data = payload.get("data")
    if not isinstance(data, Mapping):
        return None
    if event_type.startswith("organizationMembership."):
        organization = data.get("organization")
        key = organization.get("id") if isinstance(organization, Mapping) else None
    else:
        key = data.get("id")
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS:
        return None
    return f"user:{key}" if event_type.startswith("user.") else organization_tenant(key)


def organization_tenant(clerk_org_id: str) -> str:
    """The tenant key of a Clerk organization's events (and so of its workspace's, in the inbox)."""
    return f"org:{clerk_org_id}"


# The Clerk events identity handles (docs/deploy.md lists them to subscribe to), and so the ones the intake stores,
# with whose event each is.
CLERK_EVENTS = EventRoutes(
    {
        "user.*": _by_action(_user),
        "organization.*": _by_action(_organization),
        "organizationMembership.*": _by_action(_membership),
    },
    tenant_key=clerk_tenant,
)
