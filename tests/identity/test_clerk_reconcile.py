"""Clerk reconciliation: what the webhooks missed is applied from Clerk's Backend API, by the events' rules."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import select

from app.core.resources import Resources
from app.core.settings import load_settings
from app.identity import module as identity
from app.identity.models import AppUser, Workspace, WorkspaceMember
from app.identity.reconcile import reconcile_identity
from app.identity.services import clerk_time
from app.queue.errors import PermanentError
from app.runtime import open_resources
from app.testing.clerk_stub import ClerkStub
from app.testing.fixtures import clerk_stub, clerk_stub_server
from app.testing.processes import child_env
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


async def test_rows_gone_from_clerk_are_soft_deleted_only_with_full(worker: Resources, clerk_stub: ClerkStub) -> None:
    clerk_stub.put_user("user_stays", updated_at=T0)
    clerk_stub.put_user("user_goes", updated_at=T0)
    await reconcile_identity(worker)
    clerk_stub.remove("user", "user_goes")

    assert (await reconcile_identity(worker)).summary() == "Reconciled 1 Clerk objects; 0 differed."
    assert (await rows(worker, AppUser))["user_goes"].deleted_at is None
    assert (
        await reconcile_identity(worker, full=True, dry_run=True)
    ).summary() == "Reconciled 1 Clerk objects; 1 differed."
    assert (await rows(worker, AppUser))["user_goes"].deleted_at is None
    assert (await reconcile_identity(worker, full=True)).summary() == "Reconciled 1 Clerk objects; 1 differed."
    stored = await rows(worker, AppUser)
    assert stored["user_goes"].deleted_at is not None and stored["user_stays"].deleted_at is None


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
    off = await asyncio.to_thread(run, "identity", "reconcile", env={**clerk_env, "CLERK_SECRET_KEY": ""})
    assert off.returncode != 0 and "CLERK_SECRET_KEY is not set" in off.stderr
