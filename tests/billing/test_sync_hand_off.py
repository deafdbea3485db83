"""A sync waiting for its reservation holds nothing; no event is stranded however its arrival meets a sync's phases."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import pytest
from arq.jobs import Job as ArqJob
from arq.jobs import JobStatus
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select, text

from app.billing.budget import stripe_budget
from app.billing.models import BillingSync
from app.billing.sync import sync_job_id
from app.core.resources import Resources
from app.identity.models import Workspace
from app.testing import clerk_event
from app.testing.stripe_stub import StripeStub
from app.webhooks.jobs import queue_processing
from app.webhooks.processing import process_event
from tests.billing.conftest import OpenResources, store, subscription_delivery, wait_for_stub_request, workspace_row
from tests.processes import wait_for, worker_starter
from tests.webhooks.test_fair_scheduling import store_and_queue


async def _held_for_billing(resources: Resources) -> list[str]:
    """Locks a sync takes, held by any backend of the test's database: billing's advisory locks (a subject's,
    a customer's) or a lock on the workspace or a mirror table (its row lock takes one)."""
    async with resources.db.session() as session:
        query = text(
            """
            SELECT l.locktype || ' ' || coalesce(l.relation::regclass::text, l.classid::text) || ' ' || a.state
            FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
            WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() AND (
                (l.locktype = 'advisory' AND l.classid IN (21332, 21333))
                OR (l.locktype = 'relation' AND l.relation::regclass::text IN ('workspace', 'billing_sync')))
            """
        )
        return [row[0] for row in await session.execute(query)]


@pytest.mark.slow
async def test_a_sync_waiting_for_its_reservation_holds_no_worker_slot_no_transaction_and_no_lock(
    open_resources: OpenResources,
    billing_env: dict[str, str],
    stripe_stub: StripeStub,
    linked_workspace: Workspace,
    webhook_secrets: dict[str, str],
) -> None:
    """The budget's next free slot is 8 s away: the customer's sync is queued for it and, meanwhile, is not running
    (arq's own state), no backend of the database is in a transaction or holds an advisory lock, and the worker
    processes the Clerk events that came after it (one slot per queue: a waiting sync would hold it)."""
    intake = await open_resources(MESSAGE_QUEUE_DRIVER="arq", STRIPE_API_RATE_LIMIT_PER_SECOND="1")
    stripe_stub.put_subscription("cus_linked", quantity=6)
    env = {**billing_env, "MESSAGE_QUEUE_DRIVER": "arq", "STRIPE_API_RATE_LIMIT_PER_SECOND": "1"}

    async with worker_starter(env) as start:
        await start(WORKER_MAX_JOBS="1")
        # Eight slots taken once the worker is up (its start, slow on a busy machine, takes none of the 8 s):
        # the next free one in 8 s, time enough to check before it.
        reserved = time.monotonic()
        await stripe_budget(intake).reserve("customer:somebody-else", 8)
        stripe_row = await store(intake, subscription_delivery(webhook_secrets["stripe"], "cus_linked"))
        await queue_processing(intake.queue, "stripe", stripe_row, tenant_key="cus_linked")
        clerk_rows = await store_and_queue(
            intake, "clerk", [clerk_event("user.created", id=f"user_{n}") for n in range(20)]
        )

        job = ArqJob(
            f"{intake.settings.redis_namespace}{sync_job_id('customer:cus_linked', 1)}",
            intake.queue.redis,  # type: ignore[attr-defined]
            _queue_name=f"{intake.settings.redis_namespace}stripe-sync-queue",
        )

        async def sync_queued() -> bool:
            # The pending row is committed before the job is queued (a reservation and a write between them):
            # the job itself is what the checks below look at.
            async with intake.db.session() as session:
                pending = await session.scalar(
                    select(BillingSync.pending).where(BillingSync.subject == "customer:cus_linked")
                )
            return bool(pending) and await job.status() != JobStatus.not_found

        await wait_for(sync_queued, 10, "the event's job to ask for the customer's sync and queue it")
        checked_until = max(reserved + 4, time.monotonic() + 1)  # well before its reservation
        while time.monotonic() < checked_until:
            assert await job.status() == JobStatus.deferred  # queued for its reservation, not running in a slot
            assert await _held_for_billing(intake) == []
            await asyncio.sleep(0.1)

        async def clerk_processed() -> bool:
            async with intake.db.session() as session:
                query = text("SELECT count(*) FROM webhook_event WHERE id = ANY(:ids) AND processed_at IS NOT NULL")
                return await session.scalar(query, {"ids": clerk_rows}) == 20

        await wait_for(clerk_processed, 5, "the Clerk events to be processed while the sync waits")
        assert (await workspace_row(intake, linked_workspace.id)).seat_quantity is None  # not read yet

        async def stripe_processed() -> bool:
            return (await workspace_row(intake, linked_workspace.id)).seat_quantity == 6

        await wait_for(stripe_processed, 15, "the sync to read at its reservation")
    assert [path for _, path in stripe_stub.requests] == ["/v1/customers/cus_linked"]


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(arrivals=st.lists(st.floats(min_value=0.0, max_value=0.8), min_size=1, max_size=6))
@pytest.mark.slow
async def test_events_arriving_during_their_customers_sync_are_all_processed_by_one_more_read(
    open_resources: OpenResources,
    stripe_stub: StripeStub,
    linked_workspace: Workspace,
    webhook_secrets: dict[str, str],
    arrivals: list[float],
) -> None:
    """The first sync's read takes 1 s. Events arrive at drawn times while it reads (each after a change at
    Stripe), each on a process of its own: each arrival meets the first sync mid-read, the second generation
    pending, or the second waiting for the first's lock. All end processed, with Stripe's last state written,
    after exactly one more read."""
    stripe_stub.reset()
    stripe_stub.put_customer("cus_linked")
    stripe_stub.put_subscription("cus_linked", id="sub_1", quantity=1)
    stripe_stub.slow("/v1/customers/cus_linked", seconds=1.0, times=1)
    secret = webhook_secrets["stripe"]
    first = await open_resources()
    first_row = await store(first, subscription_delivery(secret, "cus_linked", id="sub_1"))
    rows = [first_row]

    async def arrive(n: int, after: float) -> None:
        await wait_for_stub_request(stripe_stub, "GET", "/v1/customers/cus_linked")
        await asyncio.sleep(after)
        stripe_stub.put_subscription("cus_linked", id="sub_1", quantity=n + 2)
        worker = await open_resources()
        row_id = await store(worker, subscription_delivery(secret, "cus_linked", id="sub_1"))
        rows.append(row_id)
        await worker_event(worker, row_id)

    async def worker_event(worker: Resources, row_id: int) -> None:
        await process_event(worker, row_id, "stripe")

    await asyncio.gather(worker_event(first, first_row), *(arrive(n, at) for n, at in enumerate(sorted(arrivals))))

    async with first.db.session() as session:
        query = text("SELECT count(*) FROM webhook_event WHERE id = ANY(:ids) AND processed_at IS NULL")
        assert await session.scalar(query, {"ids": rows}) == 0
    assert [path for _, path in stripe_stub.requests] == ["/v1/customers/cus_linked"] * 2
    row = await workspace_row(first, linked_workspace.id)
    assert row.seat_quantity == len(arrivals) + 1  # Stripe's last state
    assert row.billing_synced_at is not None and row.billing_synced_at <= datetime.now(UTC)
