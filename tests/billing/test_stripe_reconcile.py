"""Billing reconciliation repairs what events could not: rows edited by hand, lost member-limit jobs."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, text

from app.billing.reconcile import reconcile_billing
from app.core.resources import Resources
from app.identity.models import Workspace, WorkspaceMember
from app.testing.processes import child_env
from app.testing.stripe_stub import StripeStub
from tests.billing.conftest import workspace_row
from tests.factories import AppUserFactory, WorkspaceFactory, WorkspaceMemberFactory, persist
from tests.processes import ROOT


async def linked(resources: Resources, stub: StripeStub, customer: str, *, seats: int) -> int:
    stub.put_customer(customer)
    stub.put_subscription(customer, id=f"sub_{customer}", quantity=seats, price_id="price_team")
    workspace = await persist(resources.db, WorkspaceFactory.build(stripe_customer_id=customer, member_limit=3))
    return workspace.id


async def in_step(resources: Resources, synced_hours_ago: dict[int, float]) -> None:
    """Every linked workspace as Stripe has it, last synced so many hours ago."""
    await reconcile_billing(resources, every=True)
    async with resources.db.session() as session:
        for workspace_id, hours in synced_hours_ago.items():
            await session.execute(
                text("UPDATE workspace SET billing_synced_at = now() - make_interval(secs => :s) WHERE id = :id"),
                {"s": hours * 3600, "id": workspace_id},
            )
        await session.commit()


async def edit(resources: Resources, workspace_id: int, **columns: object) -> None:
    async with resources.db.session() as session:
        workspace = await session.get(Workspace, workspace_id)
        assert workspace is not None
        for name, value in columns.items():
            setattr(workspace, name, value)
        await session.commit()


async def test_a_row_edited_by_hand_is_reported_column_by_column_and_corrected(
    worker: Resources, stripe_stub: StripeStub
) -> None:
    stale = await linked(worker, stripe_stub, "cus_stale", seats=5)
    fresh = await linked(worker, stripe_stub, "cus_fresh", seats=2)
    await in_step(worker, {stale: 30, fresh: 1})
    await edit(worker, stale, seat_quantity=50, price_id="price_hacked", member_limit=50)
    await edit(worker, fresh, seat_quantity=9)  # not due: synced an hour ago

    dry = await reconcile_billing(worker, dry_run=True)
    assert (await workspace_row(worker, stale)).seat_quantity == 50  # a dry run changes nothing
    report = await reconcile_billing(worker)

    assert dry.summary() == report.summary() == "Reconciled 1 workspaces; 1 differed."
    assert {(d.workspace_id, d.column, d.stored, d.stripe) for d in report.differences} == {
        (stale, "seat_quantity", 50, 5),
        (stale, "price_id", "price_hacked", "price_team"),
        (stale, "member_limit", 50, 5),
    }
    row = await workspace_row(worker, stale)
    assert (row.seat_quantity, row.price_id, row.member_limit) == (5, "price_team", 5)
    assert row.billing_synced_at is not None and row.billing_synced_at > datetime.now(UTC) - timedelta(minutes=1)
    assert (await workspace_row(worker, fresh)).seat_quantity == 9
    assert (await reconcile_billing(worker, every=True)).summary() == "Reconciled 2 workspaces; 1 differed."


async def test_members_of_a_workspace_whose_member_limit_job_was_lost_are_re_seated(
    worker: Resources, stripe_stub: StripeStub
) -> None:
    workspace_id = await linked(worker, stripe_stub, "cus_seats", seats=2)
    await in_step(worker, {workspace_id: 30})
    members = []
    for _ in range(4):  # four active members on two paid seats: the job that suspends two never ran
        user = await persist(worker.db, AppUserFactory.build())
        members.append(
            await persist(worker.db, WorkspaceMemberFactory.build(workspace_id=workspace_id, user_id=user.id))
        )
    report = await reconcile_billing(worker)
    assert report.summary() == "Reconciled 1 workspaces; 0 differed."  # its billing columns were right
    async with worker.db.session() as session:
        suspended = (
            await session.scalars(select(WorkspaceMember.id).where(WorkspaceMember.suspended_at.is_not(None)))
        ).all()
    assert sorted(suspended) == sorted(member.id for member in members[2:])  # the newest two


@pytest.mark.slow
async def test_the_command_prints_the_differences_then_the_summary(
    billing_env: dict[str, str], worker: Resources, stripe_stub: StripeStub
) -> None:
    workspace_id = await linked(worker, stripe_stub, "cus_cli", seats=4)
    await in_step(worker, {workspace_id: 30})
    await edit(worker, workspace_id, subscription_status="canceled")
    litestar = [os.path.join(os.path.dirname(sys.executable), "litestar"), "--app", "app.asgi:create_app"]
    done = await asyncio.to_thread(
        subprocess.run,
        [*litestar, "billing", "reconcile", "--dry-run"],
        cwd=ROOT,
        env=child_env(billing_env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    header, row, last = done.stdout.strip().splitlines()
    assert header.split() == ["WORKSPACE", "COLUMN", "STORED", "STRIPE"]
    assert row.split() == [str(workspace_id), "subscription_status", "'canceled'", "'active'"]
    assert last == "Reconciled 1 workspaces; 1 differed."
