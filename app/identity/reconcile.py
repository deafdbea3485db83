"""Clerk reconciliation: every user, organization and membership Clerk lists, applied as its webhook would be.

What a webhook endpoint that was down for a week missed is whole again after
one run: each object goes through ``clerk_sync`` with the events' ordering
rules (an object older than what is stored changes nothing; a deleted row stays
deleted). ``full``: rows whose Clerk object no longer exists are soft-deleted,
stamped with the run's time (Clerk no longer says when).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.resources import Resources
from app.core.settings import Settings
from app.identity.clerk_gateway import ClerkGateway
from app.identity.clerk_sync import apply_membership, apply_organization, apply_user, reassign_seats
from app.identity.models import AppUser, Workspace, WorkspaceMember
from app.identity.services import ClerkModel, clerk_time, key_column, lock_workspace

logger = logging.getLogger(__name__)
Apply = Callable[[AsyncSession, dict[str, Any], Settings], Awaitable[None]]
Version = tuple[datetime | None, datetime | None]


@dataclass
class IdentityReport:
    dry_run: bool
    reconciled: int = 0
    differed: int = 0

    def summary(self) -> str:
        """The last line SPEC 4 gives: ``Reconciled N Clerk objects; M differed.``"""
        return f"Reconciled {self.reconciled} Clerk objects; {self.differed} differed."


async def _user(session: AsyncSession, data: dict[str, Any], settings: Settings) -> None:
    await apply_user(session, data, "Clerk API user")


async def _organization(session: AsyncSession, data: dict[str, Any], settings: Settings) -> None:
    await apply_organization(session, data, "Clerk API organization", settings)


async def _membership(session: AsyncSession, data: dict[str, Any], settings: Settings) -> None:
    await apply_membership(session, data, "Clerk API organization membership", settings, deleted_at=None)


def _differs(stored: Version | None, obj: dict[str, Any]) -> bool:
    """Missing here, or older here than in Clerk (a deleted row stays deleted: not a difference to fix)."""
    if stored is None:
        return True
    updated_at, deleted_at = stored
    if deleted_at is not None:
        return False
    return updated_at is None or updated_at < clerk_time(obj["updated_at"])


async def reconcile_identity(resources: Resources, *, full: bool = False, dry_run: bool = False) -> IdentityReport:
    report, gateway = IdentityReport(dry_run), ClerkGateway(resources.settings)
    try:
        # Users and organizations first: then a membership finds both rows (it creates minimal ones otherwise).
        kinds: list[tuple[ClerkModel, AsyncIterator[dict[str, Any]], Apply]] = [
            (AppUser, gateway.users(), _user),
            (Workspace, gateway.organizations(), _organization),
            (WorkspaceMember, gateway.memberships(), _membership),
        ]
        for model, listing, apply in kinds:
            await _reconcile_kind(resources, model, listing, apply, report, full=full)
    finally:
        await gateway.close()
    logger.info("%s", report.summary())
    return report


async def _reconcile_kind(
    resources: Resources,
    model: ClerkModel,
    listing: AsyncIterator[dict[str, Any]],
    apply: Apply,
    report: IdentityReport,
    *,
    full: bool,
) -> None:
    stored, seen, page = await _versions(resources, model), set(), []
    async for obj in listing:
        seen.add(str(obj["id"]))
        report.reconciled += 1
        report.differed += _differs(stored.get(str(obj["id"])), obj)
        page.append(obj)
        if len(page) == 100:
            await _apply_page(resources, apply, page, report)
            page = []
    await _apply_page(resources, apply, page, report)
    if full:
        gone = [key for key, (_, deleted_at) in stored.items() if deleted_at is None and key not in seen]
        report.differed += len(gone)
        if gone and not report.dry_run:
            await _delete_gone(resources, model, gone)


async def _apply_page(resources: Resources, apply: Apply, page: list[dict[str, Any]], report: IdentityReport) -> None:
    if report.dry_run or not page:
        return
    async with resources.db.session() as session:
        for obj in page:
            await apply(session, obj, resources.settings)
        await session.commit()


async def _versions(resources: Resources, model: ClerkModel) -> dict[str, Version]:
    key = getattr(model, key_column(model))
    async with resources.db.session() as session:
        rows = (await session.execute(select(key, model.clerk_updated_at, model.deleted_at))).all()
    return {str(row[0]): (row[1], row[2]) for row in rows}


async def _delete_gone(resources: Resources, model: ClerkModel, keys: list[str]) -> None:
    """Soft-delete rows Clerk no longer lists; a membership's workspace is re-seated (a seat was freed)."""
    key = getattr(model, key_column(model))
    async with resources.db.session() as session:
        if model is WorkspaceMember:
            workspaces = (
                await session.scalars(select(WorkspaceMember.workspace_id).where(key.in_(keys)).distinct())
            ).all()
            for workspace_id in sorted(workspaces):  # one order: no deadlock with a concurrent run
                await lock_workspace(session, workspace_id)
        await session.execute(
            update(model).where(key.in_(keys), model.deleted_at.is_(None)).values(deleted_at=func.now())
        )
        if model is WorkspaceMember:
            for workspace_id in sorted(workspaces):
                await reassign_seats(session, resources.settings, workspace_id)
        await session.commit()
    logger.warning("Clerk reconciliation: %d %s rows no longer in Clerk, soft-deleted.", len(keys), model.__tablename__)
