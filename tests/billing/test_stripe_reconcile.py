"""Billing reconciliation repairs what events could not: rows edited by hand, lost member-limit jobs."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, text

from app.billing import reconcile
from app.billing.crons import BillingReconcileCronJob
from app.billing.reconcile import reconcile_billing
from app.core.resources import Resources
from app.identity.models import Workspace, WorkspaceMember
from app.queue.cli import run_cron_now
from app.testing.processes import child_env
from app.testing.stripe_stub import StripeStub
from tests.billing.conftest import workspace_row
from tests.factories import AppUserFactory, WorkspaceFactory, WorkspaceMemberFactory, persist
from tests.processes import ROOT

PERIOD_END = 1_900_000_000  # 2030-03-17T17:46:40+00:00


async def linked(resources: Resources, stub: StripeStub, customer: str, *, seats: int) -> int:
    stub.put_customer(customer)
    stub.put_subscription(
        customer, id=f"sub_{customer}", quantity=seats, price_id="price_team", current_period_end=PERIOD_END
    )
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


async def test_a_workspace_stripe_cannot_read_is_logged_and_the_others_are_reconciled(
    worker: Resources, stripe_stub: StripeStub, caplog: pytest.LogCaptureFixture
) -> None:
    first = await linked(worker, stripe_stub, "cus_first", seats=2)
    gone = await linked(worker, stripe_stub, "cus_gone", seats=3)
    last = await linked(worker, stripe_stub, "cus_last", seats=4)
    stripe_stub.remove("customer", "cus_gone")  # Stripe answers 404 for it

    with caplog.at_level(logging.WARNING, logger="app.billing.reconcile"):
        report = await reconcile_billing(worker, every=True)

    assert report.summary() == "Reconciled 2 workspaces; 2 differed."
    ((failed, customer, error),) = [(f.workspace_id, f.customer_id, f.error) for f in report.failures]
    assert (failed, customer) == (gone, "cus_gone")
    assert error.startswith("PermanentError: Stripe answered reading customer cus_gone: No such customer")
    assert (await workspace_row(worker, first)).seat_quantity == 2
    assert (await workspace_row(worker, last)).seat_quantity == 4  # reconciled after the one that failed
    assert (await workspace_row(worker, gone)).seat_quantity is None
    (warning,) = [r.getMessage() for r in caplog.records if "could not be reconciled:" in r.getMessage()]
    assert f"Workspace {gone} (customer cus_gone)" in warning and "No such customer" in warning
    assert "sk_test" not in warning


async def test_the_cron_logs_a_workspace_it_cannot_read_and_reconciles_the_rest(
    worker: Resources, stripe_stub: StripeStub, caplog: pytest.LogCaptureFixture
) -> None:
    gone = await linked(worker, stripe_stub, "cus_cron_gone", seats=2)
    fine = await linked(worker, stripe_stub, "cus_cron_fine", seats=5)
    stripe_stub.remove("customer", "cus_cron_gone")

    with caplog.at_level(logging.INFO, logger="app.billing.reconcile"):
        await run_cron_now(worker, BillingReconcileCronJob)  # as `crons run BillingReconcileCronJob` runs it

    assert (await workspace_row(worker, fine)).seat_quantity == 5
    messages = [record.getMessage() for record in caplog.records]
    assert any(f"Workspace {gone} (customer cus_cron_gone) could not be reconciled" in m for m in messages)
    assert "Reconciled 1 workspaces; 1 differed." in messages


async def test_a_row_differing_from_stripe_is_reported_as_an_operator_reads_it(
    worker: Resources, stripe_stub: StripeStub
) -> None:
    workspace_id = await linked(worker, stripe_stub, "cus_shown", seats=4)
    await in_step(worker, {workspace_id: 30})
    await edit(worker, workspace_id, subscription_status="canceled", current_period_end=None, cancel_at_period_end=True)
    report = await reconcile_billing(worker, dry_run=True)
    shown = {(d.column, reconcile.shown(d.stored), reconcile.shown(d.stripe)) for d in report.differences}
    assert shown == {
        ("subscription_status", "canceled", "active"),
        ("current_period_end", "", "2030-03-17T17:46:40+00:00"),
        ("cancel_at_period_end", "true", "false"),
    }


def run_litestar(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    litestar = [os.path.join(os.path.dirname(sys.executable), "litestar"), "--app", "app.asgi:create_app"]
    return subprocess.run([*litestar, *args], cwd=ROOT, env=child_env(env), capture_output=True, text=True, timeout=60)


@pytest.mark.slow
async def test_the_command_prints_the_differences_then_the_summary(
    billing_env: dict[str, str], worker: Resources, stripe_stub: StripeStub
) -> None:
    workspace_id = await linked(worker, stripe_stub, "cus_cli", seats=4)
    await in_step(worker, {workspace_id: 30})
    await edit(worker, workspace_id, subscription_status="canceled", current_period_end=None)
    done = await asyncio.to_thread(run_litestar, billing_env, "billing", "reconcile", "--dry-run")
    assert done.returncode == 0, done.stderr
    header, *rows, last = done.stdout.strip().splitlines()
    assert header.split() == ["WORKSPACE", "COLUMN", "STORED", "STRIPE"]
    assert sorted(row.split() for row in rows) == [
        [str(workspace_id), "current_period_end", "2030-03-17T17:46:40+00:00"],  # stored: None, shown empty
        [str(workspace_id), "subscription_status", "canceled", "active"],
    ]
    assert last == "Reconciled 1 workspaces; 1 differed."


@pytest.mark.slow
async def test_the_command_names_each_workspace_it_could_not_read_and_fails(
    billing_env: dict[str, str], worker: Resources, stripe_stub: StripeStub
) -> None:
    gone = await linked(worker, stripe_stub, "cus_cli_gone", seats=2)
    await linked(worker, stripe_stub, "cus_cli_fine", seats=3)
    stripe_stub.remove("customer", "cus_cli_gone")
    done = await asyncio.to_thread(run_litestar, billing_env, "billing", "reconcile", "--all")
    assert done.returncode == 1, done.stderr
    *_, failure, last = done.stdout.strip().splitlines()
    assert failure.startswith(f"Workspace {gone} (customer cus_cli_gone) could not be reconciled: PermanentError:")
    assert last == "Reconciled 1 workspaces; 1 differed."
    assert "Traceback" not in done.stderr
