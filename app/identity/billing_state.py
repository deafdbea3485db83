"""A workspace's billing columns, as billing asks for them: found and locked by customer, read, written.

Billing decides what the columns hold (what Stripe says: ``app/billing``);
identity's repository is the one that writes the ``workspace`` row, and
journals every change it makes (``workspace_change``). Each function runs in
the caller's session and transaction; billing takes its locks in its own
order (the customer's advisory lock first, then the workspace's row).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.identity.repository import WorkspaceRepository

BILLING_COLUMNS = (
    "subscription_id",
    "subscription_status",
    "price_id",
    "seat_quantity",
    "current_period_end",
    "cancel_at_period_end",
)
"""The subscription's columns a read of Stripe writes (with ``billing_synced_at``, the read's time)."""


async def lock_billing_of_customer(session: AsyncSession, customer_id: str) -> tuple[int, datetime | None] | None:
    """The customer's workspace, locked: its id and when the read its billing was last written from began."""
    return await WorkspaceRepository(session).lock_of_customer(customer_id)


async def workspace_of_customer(session: AsyncSession, customer_id: str) -> int | None:
    return await WorkspaceRepository(session).of_customer(customer_id)


async def lock_workspace(
    session: AsyncSession, *, workspace_id: int | None, clerk_org_id: str | None
) -> tuple[int, str | None] | None:
    """The workspace (id, stripe_customer_id), locked, by its primary key or its Clerk organization id."""
    return await WorkspaceRepository(session).lock_by_key(workspace_id=workspace_id, clerk_org_id=clerk_org_id)


async def locked_billing(session: AsyncSession, workspace_id: int, customer_id: str) -> dict[str, Any] | None:
    """The billing columns and member limit, locked; None once the workspace is unlinked from ``customer_id``."""
    columns = (*BILLING_COLUMNS, "member_limit")
    return await WorkspaceRepository(session).locked_billing(workspace_id, customer_id, columns)


async def write_billing(
    session: AsyncSession, workspace_id: int, columns: Mapping[str, Any], read_began: datetime
) -> bool:
    """Write what a read of Stripe that began at ``read_began`` found, unless a later read was written already.

    ``billing_synced_at`` becomes ``read_began``; only the other columns count as
    a change (a read that found what was stored journals nothing).
    """
    return await WorkspaceRepository(session).write_billing(workspace_id, columns, read_began)


async def link_customer(session: AsyncSession, workspace_id: int, customer_id: str) -> None:
    await WorkspaceRepository(session).link_customer(workspace_id, customer_id)


async def linked_workspaces(session: AsyncSession, *, every: bool, stale_hours: int) -> Sequence[tuple[int, str]]:
    """Linked workspaces (id, customer) not synced for ``stale_hours`` (or all of them)."""
    return await WorkspaceRepository(session).linked(every=every, stale_hours=stale_hours)
