"""The member limit follows the seats: the newest members lose their seats first and get them back last."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from app.billing.repository import BillingRepository
from app.core.resources import Resources
from app.identity.models import Workspace, WorkspaceMember
from app.identity.seats import ApplyWorkspaceMemberLimitData, ApplyWorkspaceMemberLimitJob
from app.queue.models import JobOutbox
from app.queue.registry import JobRegistry
from app.runtime import WORKER_MODULES
from app.testing import process_delivery
from app.testing.processes import free_port
from app.testing.stripe_stub import StripeStub
from app.webhooks.inbox import Inbox
from app.worker.arq_worker import rerun_after_kill_seconds
from tests.billing.conftest import OpenResources, comes_back, store, subscription_delivery, workspace_row
from tests.factories import AppUserFactory, WorkspaceMemberFactory, persist
from tests.processes import wait_for, worker_starter


async def _members_by_join_order(resources: Resources, workspace: Workspace, count: int) -> list[int]:
    """``count`` active members who joined a minute apart, plus one who left (never counted)."""
    joined = datetime(2025, 1, 1, tzinfo=UTC)
    ids = []
    for position in range(count + 1):
        user = await persist(resources.db, AppUserFactory.build())
        member = WorkspaceMemberFactory.build(
            workspace_id=workspace.id,
            user_id=user.id,
            created_at=joined + timedelta(minutes=position),
            deleted_at=joined + timedelta(days=1) if position == 1 else None,
        )
        ids.append((await persist(resources.db, member)).id)
    return [member_id for position, member_id in enumerate(ids) if position != 1]


async def _suspensions(resources: Resources, workspace: Workspace) -> dict[int, datetime | None]:
    async with resources.db.session() as session:
        members = await session.scalars(
            select(WorkspaceMember).where(WorkspaceMember.workspace_id == workspace.id).order_by(WorkspaceMember.id)
        )
        return {member.id: member.suspended_at for member in members if member.deleted_at is None}


async def _seats_become(
    resources: Resources, stripe_stub: StripeStub, secret: str, quantity: int
) -> dict[int, datetime | None]:
    stripe_stub.put_subscription("cus_linked", id="sub_seats", quantity=quantity)
    await process_delivery(resources, subscription_delivery(secret, "cus_linked", id="sub_seats"))
    async with resources.db.session() as session:
        workspace = (await session.scalars(select(Workspace))).one()
    return await _suspensions(resources, workspace)


async def test_lowering_then_raising_seats_suspends_newest_then_restores_oldest_first(
    worker: Resources, stripe_stub: StripeStub, linked_workspace: Workspace, webhook_secrets: dict[str, str]
) -> None:
    secret = webhook_secrets["stripe"]
    first, second, third, fourth, fifth = await _members_by_join_order(worker, linked_workspace, 5)
    assert all(at is None for at in (await _seats_become(worker, stripe_stub, secret, 5)).values())

    lowered = await _seats_become(worker, stripe_stub, secret, 2)
    assert [m for m, at in lowered.items() if at is not None] == [third, fourth, fifth]

    raised = await _seats_become(worker, stripe_stub, secret, 4)
    assert [m for m, at in raised.items() if at is None] == [first, second, third, fourth]
    assert raised[fifth] == lowered[fifth]  # still suspended, since the first suspension


async def test_running_the_job_twice_changes_nothing(worker: Resources, linked_workspace: Workspace) -> None:
    await _members_by_join_order(worker, linked_workspace, 5)
    data = ApplyWorkspaceMemberLimitData(workspace_id=linked_workspace.id)  # the workspace's limit is 3

    await worker.queue.add(ApplyWorkspaceMemberLimitJob, data)
    once = await _suspensions(worker, linked_workspace)
    await worker.queue.add(ApplyWorkspaceMemberLimitJob, data)
    twice = await _suspensions(worker, linked_workspace)

    assert sum(at is not None for at in once.values()) == 2
    assert twice == once


async def test_a_run_lost_with_its_worker_runs_again_within_a_minute(worker: Resources) -> None:
    """A SIGKILLed worker, or Redis restarting while the job ran, leaves its in-progress mark until the job's
    timeout (plus arq's margins) has passed: only then does another worker run it, and apply the seats."""
    jobs_on_its_queue = JobRegistry.from_modules(WORKER_MODULES).jobs_on(ApplyWorkspaceMemberLimitJob.queue)
    assert ApplyWorkspaceMemberLimitJob in jobs_on_its_queue
    assert rerun_after_kill_seconds(jobs_on_its_queue, worker) <= 60


async def test_a_member_limit_job_staged_while_redis_refuses_is_relayed_and_run_by_a_worker(
    open_resources: OpenResources,
    settings_env: dict[str, str],
    stripe_stub: StripeStub,
    linked_workspace: Workspace,
    webhook_secrets: dict[str, str],
) -> None:
    """Redis refuses the process running the customer's sync between its commit and its relay: the job waits in
    job_outbox, and a worker (healthy Redis) queues and runs it, so the seats are enforced anyway."""
    refused = f"redis://127.0.0.1:{free_port()}/0"
    pipeline = await open_resources(MESSAGE_QUEUE_DRIVER="arq", REDIS_URL=refused)
    members = await _members_by_join_order(pipeline, linked_workspace, 5)
    stripe_stub.put_subscription("cus_linked", id="sub_seats", quantity=2)

    delivery = subscription_delivery(webhook_secrets["stripe"], "cus_linked", id="sub_seats")
    row_id = await store(pipeline, delivery)
    await BillingRepository(pipeline.db).want_sync("customer:cus_linked", datetime.now(UTC), 180.0, 1)  # as asked
    assert await comes_back(pipeline, "customer:cus_linked") is None  # the sync's job runs; its relay is refused
    row = await Inbox(pipeline.db).get(row_id)
    assert row is not None and row.processed_at is not None
    assert (await workspace_row(pipeline, linked_workspace.id)).member_limit == 2
    async with pipeline.db.session() as session:
        assert list((await session.scalars(select(JobOutbox.job_name))).all()) == ["ApplyWorkspaceMemberLimitJob"]
    assert all(at is None for at in (await _suspensions(pipeline, linked_workspace)).values())

    async def suspended() -> list[int]:
        return [m for m, at in (await _suspensions(pipeline, linked_workspace)).items() if at is not None]

    async with worker_starter(settings_env, "--queues", "identity-queue") as start_worker:
        await start_worker()
        # The two oldest members keep their seats; the three newest are suspended.
        assert await wait_for(suspended, 10, "the worker to apply the member limit") == members[2:]
    async with pipeline.db.session() as session:
        assert (await session.scalars(select(JobOutbox))).all() == []
