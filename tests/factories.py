"""Rows built with polyfactory: valid by default, so a test states only what its scenario is about.

Build, then persist with :func:`persist` (one session per call, committed):
``workspace = await persist(db, WorkspaceFactory.build(member_limit=5))``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, TypeVar

from polyfactory import Use
from polyfactory.factories.sqlalchemy_factory import SQLAlchemyFactory

from app.core.db import Database
from app.identity.models import AppUser, Workspace, WorkspaceMember
from app.testing.deliveries import random_id

RowT = TypeVar("RowT")


class _ClerkRowFactory(SQLAlchemyFactory[Any]):
    """Clerk-synced rows: ids from the database, not deleted, no Clerk version yet, created now."""

    __is_base_factory__ = True
    __set_primary_key__ = False
    __set_relationships__ = False
    clerk_updated_at = None
    deleted_at = None
    created_at = Use(lambda: datetime.now(UTC))


class WorkspaceFactory(_ClerkRowFactory):
    """A workspace on the free plan, with no Stripe customer unless given one."""

    __model__ = Workspace
    clerk_org_id = Use(random_id, "org")
    name = Use(lambda: f"Workspace {random_id('w', 6)}")
    slug = None
    stripe_customer_id = None
    subscription_id = None
    subscription_status = None
    price_id = None
    seat_quantity = None
    member_limit = 3
    current_period_end = None
    cancel_at_period_end = False
    billing_synced_at = None


class AppUserFactory(_ClerkRowFactory):
    __model__ = AppUser
    clerk_user_id = Use(random_id, "user")
    email = Use(lambda: f"{random_id('u', 8).lower()}@example.com")


class WorkspaceMemberFactory(_ClerkRowFactory):
    """An active member; pass ``workspace_id`` and ``user_id`` (the rows must exist)."""

    __model__ = WorkspaceMember
    clerk_membership_id = Use(random_id, "orgmem")
    role = "org:member"
    suspended_at = None


async def persist(db: Database, *rows: RowT) -> RowT:
    """Insert the rows in one committed transaction; returns the first (ids are filled in)."""
    async with db.session() as session:
        session.add_all(rows)
        await session.commit()
    return rows[0]
