"""Clerk reconciliation: every user, organization and membership Clerk lists, applied as its webhook would be.

What a webhook endpoint that was down for a week missed is whole again after
one run: each object goes through ``IdentityService`` with the events' ordering
rules (an object older than what is stored changes nothing; a deleted row stays
deleted). Rows whose Clerk object no longer exists are soft-deleted, stamped
with the run's time (Clerk no longer says when), once Clerk confirms it: see
``reconcile_identity``. The cron and the command run the same pass.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from app.core.resources import Resources
from app.identity.clerk_gateway import CLERK, ClerkGateway
from app.identity.models import AppUser, Workspace, WorkspaceMember
from app.identity.repository import ClerkModel, Version, WorkspaceRepository, clerk_rows
from app.identity.services import IdentityService, clerk_time

logger = logging.getLogger(__name__)
Apply = Callable[[IdentityService, dict[str, Any]], Awaitable[None]]


@dataclass
class IdentityReport:
    dry_run: bool
    reconciled: int = 0
    differed: int = 0

    def summary(self) -> str:
        """The command's last line (docs/operations.md): ``Reconciled N Clerk objects; M differed.``"""
        return f"Reconciled {self.reconciled} Clerk objects; {self.differed} differed."


async def _user(identity: IdentityService, data: dict[str, Any]) -> None:
    await identity.apply_user(data, "Clerk API user")


async def _organization(identity: IdentityService, data: dict[str, Any]) -> None:
    await identity.apply_organization(data, "Clerk API organization")


async def _membership(identity: IdentityService, data: dict[str, Any]) -> None:
    await identity.apply_membership(data, "Clerk API organization membership")


def _differs(stored: Version | None, obj: dict[str, Any]) -> bool:
    """Missing here, or older here than in Clerk (a deleted row stays deleted: not a difference to fix)."""
    if stored is None:
        return True
    updated_at, deleted_at = stored
    if deleted_at is not None:
        return False
    return updated_at is None or updated_at < clerk_time(obj["updated_at"])


@dataclass(frozen=True)
class _Kind:
    model: ClerkModel
    listing: Callable[[ClerkGateway], AsyncIterator[dict[str, Any]]]
    apply: Apply


# Users and organizations first: then a membership finds both rows (it creates minimal ones otherwise).
_KINDS = (
    _Kind(AppUser, ClerkGateway.users, _user),
    _Kind(Workspace, ClerkGateway.organizations, _organization),
    _Kind(WorkspaceMember, ClerkGateway.memberships, _membership),
)


async def reconcile_identity(resources: Resources, *, dry_run: bool = False) -> IdentityReport:
    """Apply every object Clerk lists; then soft-delete the rows whose object Clerk confirms is gone.

    A row absent from a listing is only a candidate: offset pages shift when
    Clerk deletes an object while they are read, so an object can be skipped.
    Each candidate is read again on its own, and deleted only when Clerk
    answers 404 for it (an object found is applied instead). Nothing is
    deleted unless every page of every kind was read: a failed page raises
    before any deletion.
    """
    report, gateway = IdentityReport(dry_run), ClerkGateway(resources.settings, CLERK.of(resources))
    try:
        missing = [await _reconcile_kind(resources, kind, gateway, report) for kind in _KINDS]
        for kind, (stored, candidates) in zip(_KINDS, missing, strict=True):
            await _confirm_gone(resources, kind, gateway, stored, candidates, report)
    finally:
        await gateway.close()
    logger.info("%s", report.summary())
    return report


async def _reconcile_kind(
    resources: Resources, kind: _Kind, gateway: ClerkGateway, report: IdentityReport
) -> tuple[dict[str, Version], list[str]]:
    """Apply every listed object of the kind; return the stored versions and the live rows the listing lacked."""
    stored, seen, page = await _versions(resources, kind.model), set(), []
    async for obj in kind.listing(gateway):
        seen.add(str(obj["id"]))
        report.reconciled += 1
        report.differed += _differs(stored.get(str(obj["id"])), obj)
        page.append(obj)
        if len(page) == 100:
            await _apply_page(resources, kind.apply, page, report)
            page = []
    await _apply_page(resources, kind.apply, page, report)
    return stored, sorted(key for key, (_, deleted_at) in stored.items() if deleted_at is None and key not in seen)


async def _confirm_gone(
    resources: Resources,
    kind: _Kind,
    gateway: ClerkGateway,
    stored: dict[str, Version],
    candidates: list[str],
    report: IdentityReport,
) -> None:
    """Each candidate read again: gone (404) is soft-deleted, found is applied, an error leaves it for next run."""
    gone, found = [], []
    async for key, current in _read_again(resources, kind.model, gateway, candidates):
        if isinstance(current, Exception):
            logger.warning(
                "Clerk reconciliation: could not confirm that %s %s is gone (%s); kept until a run can.",
                kind.model.__tablename__,
                key,
                current,
            )
        elif current is None:
            gone.append(key)
        else:  # skipped by a listing whose pages shifted
            found.append(current)
            report.reconciled += 1
            report.differed += _differs(stored.get(key), current)
    report.differed += len(gone)
    await _apply_page(resources, kind.apply, found, report)
    if gone and not report.dry_run:
        await _delete_gone(resources, kind.model, gone)


async def _read_again(
    resources: Resources, model: ClerkModel, gateway: ClerkGateway, keys: list[str]
) -> AsyncIterator[tuple[str, dict[str, Any] | Exception | None]]:
    """Each key's object as Clerk has it now (None: Clerk answered 404), or the error reading it."""
    if not keys:
        return
    read = await _reader(resources, model, gateway, keys)
    for key in keys:
        try:
            yield key, await read(key)
        except Exception as exc:
            yield key, exc


async def _reader(
    resources: Resources, model: ClerkModel, gateway: ClerkGateway, keys: list[str]
) -> Callable[[str], Awaitable[dict[str, Any] | None]]:
    if model is AppUser:
        return gateway.user
    if model is Workspace:
        return gateway.organization
    async with resources.db.session() as session:  # a membership is read through its organization and user
        links = await WorkspaceRepository(session).membership_links(keys)

    async def membership(key: str) -> dict[str, Any] | None:
        organization, user = links.get(key, (None, None))
        if organization is None or user is None:
            raise LookupError("its organization or user has no Clerk id here")
        return await gateway.membership(key, organization, user)

    return membership


async def _apply_page(resources: Resources, apply: Apply, page: list[dict[str, Any]], report: IdentityReport) -> None:
    if report.dry_run or not page:
        return
    async with resources.db.session() as session:
        identity = IdentityService(session, resources.settings)
        for obj in page:
            await apply(identity, obj)
        await session.commit()


async def _versions(resources: Resources, model: ClerkModel) -> dict[str, Version]:
    async with resources.db.session() as session:
        return await clerk_rows(model, session).versions()


async def _delete_gone(resources: Resources, model: ClerkModel, keys: list[str]) -> None:
    async with resources.db.session() as session:
        await IdentityService(session, resources.settings).delete_gone(model, keys)
        await session.commit()
    logger.warning(
        "Clerk reconciliation: %d %s rows no longer in Clerk (each confirmed by a 404), soft-deleted.",
        len(keys),
        model.__tablename__,
    )
