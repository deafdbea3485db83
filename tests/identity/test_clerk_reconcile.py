"""Clerk reconciliation: what the webhooks missed is applied from Clerk's Backend API, by the events' rules."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import func, select

from app.core.resources import Resources
from app.core.settings import load_settings
from app.identity import module as identity
from app.identity.crons import IdentityReconcileCronJob
from app.identity.models import AppUser, Workspace, WorkspaceMember
from app.identity.reconcile import reconcile_identity
from app.identity.services import clerk_time
from app.queue.cli import run_cron_now
from app.queue.errors import PermanentError
from app.runtime import open_resources
from app.testing.clerk_stub import ClerkStub
from app.testing.fixtures import clerk_stub, clerk_stub_server
from app.testing.processes import child_env
from tests.factories import WorkspaceFactory, persist
from tests.journal import Change, journal
from tests.processes import ROOT

__all__ = ["clerk_stub", "clerk_stub_server"]
T0 = 1_750_000_000_000


@pytest.fixture
def clerk_env(settings_env: dict[str, str], clerk_stub: ClerkStub) -> dict[str, str]:
    return {
        **settings_env,
        "MESSAGE_QUEUE_DRIVER": "sync",
        "CLERK_SECRET_KEY": "sk_test_reconcile",
        "CLERK_API_BASE": f"{clerk_stub.base_url}/v1",
    }


@pytest.fixture
async def worker(clerk_env: dict[str, str]) -> AsyncIterator[Resources]:
    resources = open_resources(load_settings(clerk_env), [identity.MODULE])
    yield resources
    await resources.close()


async def run_cron(resources: Resources) -> None:
    """A tick of IdentityReconcileCronJob, as ``crons run IdentityReconcileCronJob`` runs it."""
    await run_cron_now(resources, IdentityReconcileCronJob)


async def rows(resources: Resources, model: Any) -> dict[str, Any]:
    key = {
        AppUser: AppUser.clerk_user_id,
        Workspace: Workspace.clerk_org_id,
        WorkspaceMember: WorkspaceMember.clerk_membership_id,
    }[model]
    async with resources.db.session() as session:
        return {getattr(row, key.key): row for row in (await session.scalars(select(model))).all()}


async def test_missing_users_organizations_and_memberships_are_created(
    worker: Resources, clerk_stub: ClerkStub
) -> None:
    clerk_stub.put_user("user_ada", email="ada@example.org", first_name="Ada", updated_at=T0)
    clerk_stub.put_organization("org_engines", name="Engines", slug="engines", updated_at=T0)
    clerk_stub.put_membership("orgmem_1", organization="org_engines", user="user_ada", role="org:admin", updated_at=T0)

    report = await reconcile_identity(worker)
    assert report.summary() == "Reconciled 3 Clerk objects; 3 differed."
    (user,) = (await rows(worker, AppUser)).values()
    (workspace,) = (await rows(worker, Workspace)).values()
    (member,) = (await rows(worker, WorkspaceMember)).values()
    assert (user.email, user.first_name, user.clerk_updated_at) == ("ada@example.org", "Ada", clerk_time(T0))
    assert (workspace.name, workspace.slug) == ("Engines", "engines")
    assert (member.role, member.workspace_id, member.user_id) == ("org:admin", workspace.id, user.id)
    assert (await reconcile_identity(worker)).summary() == "Reconciled 3 Clerk objects; 0 differed."


async def test_an_object_older_than_the_stored_one_changes_nothing(worker: Resources, clerk_stub: ClerkStub) -> None:
    clerk_stub.put_user("user_ada", first_name="Newer", updated_at=T0 + 1000)
    await reconcile_identity(worker)
    clerk_stub.put_user("user_ada", first_name="Older", updated_at=T0)  # e.g. read from a lagging replica
    report = await reconcile_identity(worker)
    assert report.summary() == "Reconciled 1 Clerk objects; 0 differed."
    assert (await rows(worker, AppUser))["user_ada"].first_name == "Newer"


async def test_rows_gone_from_clerk_are_soft_deleted_once_clerk_confirms_it(
    worker: Resources, clerk_stub: ClerkStub
) -> None:
    clerk_stub.put_user("user_stays", updated_at=T0)
    clerk_stub.put_user("user_goes", updated_at=T0)
    await reconcile_identity(worker)
    clerk_stub.remove("user", "user_goes")

    dry = await reconcile_identity(worker, dry_run=True)
    assert dry.summary() == "Reconciled 1 Clerk objects; 1 differed."
    assert (await rows(worker, AppUser))["user_goes"].deleted_at is None
    assert (await reconcile_identity(worker)).summary() == "Reconciled 1 Clerk objects; 1 differed."
    stored = await rows(worker, AppUser)
    assert stored["user_goes"].deleted_at is not None and stored["user_stays"].deleted_at is None
    assert ("GET", "/v1/users/user_goes") in clerk_stub.requests  # read again: Clerk answered 404
    assert (await reconcile_identity(worker)).summary() == "Reconciled 1 Clerk objects; 0 differed."


async def test_reconciliation_journals_what_it_changed_naming_the_cron(
    worker: Resources, clerk_stub: ClerkStub
) -> None:
    clerk_stub.put_user("user_ada", first_name="Ada", updated_at=T0)
    clerk_stub.put_user("user_goes", updated_at=T0)
    await run_cron(worker)
    clerk_stub.put_user("user_ada", first_name="Augusta", updated_at=T0 + 10)
    clerk_stub.remove("user", "user_goes")
    await run_cron(worker)
    await run_cron(worker)  # nothing differs any more: nothing journaled

    created = [change for change in await journal(worker.db) if change.changes.get("clerk_user_id", [0])[0] is None]
    later = (await journal(worker.db))[len(created) :]
    assert {change.source for change in created} == {"IdentityReconcileCronJob"} and len(created) == 2
    assert [(change.source, list(change.changes)) for change in later] == [
        ("IdentityReconcileCronJob", ["first_name"]),
        ("IdentityReconcileCronJob", ["deleted_at"]),
    ]
    assert later[0].changes["first_name"] == ["Ada", "Augusta"]


async def test_an_object_skipped_by_shifting_pages_is_applied_not_deleted(
    worker: Resources, clerk_stub: ClerkStub, caplog: pytest.LogCaptureFixture
) -> None:
    """user_140 is gone before the run. Clerk deletes user_005 while the listing is between pages, so the second
    page starts one later and skips user_100. Read again, only user_140 answers 404: user_100 is applied."""
    for n in range(150):
        clerk_stub.put_user(f"user_{n:03d}", updated_at=T0 + n, created_at=T0 + n)
    await reconcile_identity(worker)
    clerk_stub.remove("user", "user_140")
    clerk_stub.put_user("user_100", first_name="Renamed", updated_at=T0 + 5000, created_at=T0 + 100)
    clerk_stub.when_listed("user", 0, lambda: clerk_stub.remove("user", "user_005"))

    with caplog.at_level(logging.INFO, logger="app.identity.reconcile"):
        await run_cron(worker)

    # 148 listed and user_100 read again; user_100 renamed and user_140 gone differed
    assert "Reconciled 149 Clerk objects; 2 differed." in [record.getMessage() for record in caplog.records]
    stored = await rows(worker, AppUser)
    assert stored["user_140"].deleted_at is not None
    assert stored["user_100"].deleted_at is None and stored["user_100"].first_name == "Renamed"
    assert stored["user_005"].deleted_at is None  # listed on the first page, before its deletion
    assert sum(row.deleted_at is not None for row in stored.values()) == 1
    assert (await reconcile_identity(worker)).summary() == "Reconciled 148 Clerk objects; 1 differed."
    assert (await rows(worker, AppUser))["user_005"].deleted_at is not None  # the next run sees it gone


async def test_nothing_is_deleted_when_a_listing_page_failed(worker: Resources, clerk_stub: ClerkStub) -> None:
    clerk_stub.put_user("user_goes", updated_at=T0)
    clerk_stub.put_organization("org_1", updated_at=T0)
    clerk_stub.put_membership("orgmem_1", organization="org_1", user="user_goes", updated_at=T0)
    await reconcile_identity(worker)
    clerk_stub.remove("user", "user_goes")
    clerk_stub.fail("/v1/organization_memberships", status=502)  # the last kind listed

    with pytest.raises(RuntimeError, match="HTTP 502"):
        await reconcile_identity(worker)
    assert (await rows(worker, AppUser))["user_goes"].deleted_at is None  # although its own listing was whole
    assert not [path for _, path in clerk_stub.requests if path == "/v1/users/user_goes"]


async def test_workspaces_with_no_clerk_organization_are_none_of_clerks_business(
    worker: Resources, clerk_stub: ClerkStub
) -> None:
    for _ in range(2):
        await persist(worker.db, WorkspaceFactory.build(clerk_org_id=None))
    clerk_stub.put_organization("org_real", updated_at=T0)
    assert (await reconcile_identity(worker)).summary() == "Reconciled 1 Clerk objects; 1 differed."
    assert (await reconcile_identity(worker)).summary() == "Reconciled 1 Clerk objects; 0 differed."
    async with worker.db.session() as session:
        assert (await session.scalar(select(func.count()).where(Workspace.deleted_at.is_not(None)))) == 0


async def test_the_cron_repairs_a_membership_deleted_while_the_endpoint_was_down(
    clerk_env: dict[str, str], clerk_stub: ClerkStub, caplog: pytest.LogCaptureFixture
) -> None:
    """One seat: the old member left and a new one joined while no webhook arrived. With the old membership
    still live here the new member would stay suspended; one cron run deletes it and gives the seat back."""
    resources = open_resources(load_settings({**clerk_env, "FREE_PLAN_MEMBER_LIMIT": "1"}), [identity.MODULE])
    try:
        clerk_stub.put_organization("org_seats", updated_at=T0)
        for user in ("user_old", "user_new"):
            clerk_stub.put_user(user, updated_at=T0)
        clerk_stub.put_membership("orgmem_old", organization="org_seats", user="user_old", updated_at=T0)
        await run_cron(resources)
        clerk_stub.remove("membership", "orgmem_old")  # its organizationMembership.deleted never arrived
        clerk_stub.put_membership("orgmem_new", organization="org_seats", user="user_new", updated_at=T0 + 9000)

        with caplog.at_level(logging.INFO, logger="app.identity.reconcile"):
            await run_cron(resources)

        members = await rows(resources, WorkspaceMember)
        assert members["orgmem_old"].deleted_at is not None
        assert members["orgmem_new"].deleted_at is None and members["orgmem_new"].suspended_at is None
        assert "Reconciled 4 Clerk objects; 2 differed." in [record.getMessage() for record in caplog.records]
        assert ("GET", "/v1/organizations/org_seats/memberships") in clerk_stub.requests
    finally:
        await resources.close()


async def test_every_page_is_read(worker: Resources, clerk_stub: ClerkStub) -> None:
    for n in range(250):
        clerk_stub.put_user(f"user_{n:03d}", updated_at=T0 + n, created_at=T0 + n)
    report = await reconcile_identity(worker)
    assert report.summary() == "Reconciled 250 Clerk objects; 250 differed."
    assert len(await rows(worker, AppUser)) == 250
    assert [path for _, path in clerk_stub.requests].count("/v1/users") == 3


async def test_a_wrong_key_is_a_permanent_error_naming_the_setting(clerk_env: dict[str, str]) -> None:
    resources = open_resources(load_settings({**clerk_env, "CLERK_SECRET_KEY": "not-a-key"}), [identity.MODULE])
    try:
        with pytest.raises(PermanentError, match="CLERK_SECRET_KEY"):
            await reconcile_identity(resources)
    finally:
        await resources.close()


async def journal_of(env: dict[str, str]) -> list[Change]:
    resources = open_resources(load_settings(env), [identity.MODULE])
    try:
        return await journal(resources.db)
    finally:
        await resources.close()


@pytest.mark.slow
async def test_the_command_says_how_many(clerk_env: dict[str, str], clerk_stub: ClerkStub) -> None:
    clerk_stub.put_organization("org_cli", updated_at=T0)
    litestar = [os.path.join(os.path.dirname(sys.executable), "litestar"), "--app", "app.asgi:create_app"]

    def run(*args: str, env: dict[str, str] = clerk_env) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*litestar, *args], cwd=ROOT, env=child_env(env), capture_output=True, text=True, timeout=60
        )

    dry = await asyncio.to_thread(run, "identity", "reconcile", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.strip().splitlines()[-1] == "Reconciled 1 Clerk objects; 1 differed."
    assert await journal_of(clerk_env) == []  # a dry run applies nothing
    applied = await asyncio.to_thread(run, "identity", "reconcile")
    assert applied.returncode == 0, applied.stderr
    assert [(change.source, change.entity) for change in await journal_of(clerk_env)] == [
        ("litestar identity reconcile", "workspace")
    ]
    full = await asyncio.to_thread(run, "identity", "reconcile", "--full", "--dry-run")  # every run is whole
    assert full.returncode == 2 and "--full" in full.stderr  # click: no such option
    off = await asyncio.to_thread(run, "identity", "reconcile", env={**clerk_env, "CLERK_SECRET_KEY": ""})
    assert off.returncode != 0 and "CLERK_SECRET_KEY is not set" in off.stderr
