"""``webhooks replay ID --dry-run``: what today's handler would change, against today's state, writing nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import select, update

from app.core.db import driver_connection, metadata
from app.core.journal import event_cause
from app.core.resources import Resources
from app.identity.models import Workspace
from app.runtime import all_models
from app.testing import clerk_event, process_delivery, signed_clerk_delivery
from app.testing.stripe_stub import StripeStub
from app.webhooks.inbox import InboxUpkeep
from app.webhooks.operations import OperatorError
from app.webhooks.preview import preview_replay
from app.webhooks.processing import process_event
from tests.billing.conftest import OpenResources, subscription_delivery, workspace_row
from tests.billing.test_stripe_reconcile import run_litestar
from tests.journal import journal
from tests.stubs.sentry_ingest import SentryIngestStub

PERIOD = {"price_id": "price_team", "current_period_end": 1_900_000_000}


async def snapshot(resources: Resources) -> dict[str, Any]:
    """Every row of every table, and every queue key in Redis: what a dry run must leave as it found it."""
    all_models()
    rows = {}
    async with driver_connection(resources.db) as connection:
        for table in metadata.sorted_tables:
            rows[table.name] = await connection.fetch(f"SELECT to_jsonb(t)::text FROM {table.name} t ORDER BY 1")
    namespace = resources.settings.redis_namespace
    keys = {key for key in await resources.redis.keys(f"{namespace}*") if b":stripe:" not in key}
    return {"rows": {name: [row[0] for row in found] for name, found in rows.items()}, "redis": keys}


async def a_subscription_of(worker: Resources, stripe_stub: StripeStub, secret: str, quantity: int) -> tuple[int, Any]:
    stripe_stub.put_subscription("cus_linked", id="sub_1", quantity=quantity, **PERIOD)
    row = await process_delivery(worker, subscription_delivery(secret, "cus_linked", id="sub_1", quantity=quantity))
    return row.row_id, row


async def test_a_stripe_dry_run_reports_the_new_seats_and_leaves_every_table_and_the_queue_as_they_were(
    worker: Resources,
    open_resources: OpenResources,
    stripe_stub: StripeStub,
    linked_workspace: Workspace,
    webhook_secrets: dict[str, str],
) -> None:
    row_id, _ = await a_subscription_of(worker, stripe_stub, webhook_secrets["stripe"], 5)
    stripe_stub.put_subscription("cus_linked", id="sub_1", quantity=8, **PERIOD)  # changed since, no event yet
    operator = await open_resources(MESSAGE_QUEUE_DRIVER="arq")  # a job queued would be in Redis
    before, reads = await snapshot(operator), len(stripe_stub.requests)

    preview = await preview_replay(operator, str(row_id))

    assert await snapshot(operator) == before
    assert len(stripe_stub.requests) == reads + 1  # read today's state, through the budget
    workspace = linked_workspace.id
    assert [(c.entity, c.entity_id, c.column, c.stored, c.would_be) for c in preview.changes] == [
        ("workspace", workspace, "seat_quantity", 5, 8),
        ("workspace", workspace, "member_limit", 5, 8),
    ]
    assert preview.staged == [("ApplyWorkspaceMemberLimitJob", {"workspace_id": workspace})]
    lines = preview.lines()
    assert lines[-1] == "Would change 2 fields of 1 row."
    assert lines[1].split() == ["ENTITY", "ID", "COLUMN", "STORED", "WOULD", "BE"]
    assert lines[2].split() == ["workspace", str(workspace), "seat_quantity", "5", "8"]
    assert "Would queue ApplyWorkspaceMemberLimitJob" in lines[-2]

    # The real replay then applies it and journals it, reading Stripe again (the dry run was no sync).
    await InboxUpkeep(worker.db).reset_for_replay(row_id)
    await process_event(worker, row_id, "stripe")
    assert (await workspace_row(worker, workspace)).seat_quantity == 8
    assert len(stripe_stub.requests) == reads + 2
    last = (await journal(worker.db, entity="workspace"))[-2:]
    assert [(c.source, c.changes) for c in last] == [
        (event_cause(row_id), {"seat_quantity": [5, 8]}),
        (event_cause(row_id), {"member_limit": [5, 8]}),
    ]


async def test_a_dry_run_that_would_change_nothing_says_so(
    worker: Resources, stripe_stub: StripeStub, linked_workspace: Workspace, webhook_secrets: dict[str, str]
) -> None:
    row_id, _ = await a_subscription_of(worker, stripe_stub, webhook_secrets["stripe"], 5)

    preview = await preview_replay(worker, str(row_id))

    assert (preview.changes, preview.staged, preview.error) == ([], [], None)
    assert preview.lines()[-1] == "Would change 0 fields of 0 rows."


async def test_a_clerk_dry_run_reports_what_the_event_would_put_back(
    worker: Resources, webhook_secrets: dict[str, str]
) -> None:
    body = clerk_event("organization.created", timestamp=1_750_000_000_000, id="org_1", name="Acme", slug="acme")
    row = await process_delivery(worker, signed_clerk_delivery(body, webhook_secrets["clerk"]))
    async with worker.db.session() as session:  # edited by hand since
        workspace = (await session.scalars(select(Workspace))).one()
        await session.execute(update(Workspace).values(name="Hacked"))
        await session.commit()
    before = await snapshot(worker)

    preview = await preview_replay(worker, str(row.row_id))

    assert await snapshot(worker) == before
    assert [(c.entity, c.entity_id, c.column, c.stored, c.would_be) for c in preview.changes] == [
        ("workspace", workspace.id, "name", "Hacked", "Acme")
    ]
    assert preview.lines()[-1] == "Would change 1 field of 1 row."


async def test_a_dry_run_whose_handler_fails_shows_the_error_and_writes_nothing(
    worker: Resources, stripe_stub: StripeStub, linked_workspace: Workspace, webhook_secrets: dict[str, str]
) -> None:
    row_id, _ = await a_subscription_of(worker, stripe_stub, webhook_secrets["stripe"], 5)
    stripe_stub.remove("customer", "cus_linked")  # a replay would now fail for good (404)
    before = await snapshot(worker)

    preview = await preview_replay(worker, str(row_id))

    assert await snapshot(worker) == before  # the event's attempts and last error included
    assert preview.error is not None and preview.error.startswith("PermanentError:")
    assert preview.lines()[-2] == f"The handler would fail: {preview.error}"
    assert preview.lines()[-1] == "Would change 0 fields of 0 rows."


async def test_an_unknown_event_is_refused_by_name(worker: Resources) -> None:
    with pytest.raises(OperatorError, match="No webhook event with row id or event id 'evt_nope'"):
        await preview_replay(worker, "evt_nope")


@pytest.mark.slow
async def test_the_command_prints_the_changes_and_a_failing_one_exits_non_zero_without_a_sentry_event(
    billing_env: dict[str, str],
    worker: Resources,
    stripe_stub: StripeStub,
    linked_workspace: Workspace,
    webhook_secrets: dict[str, str],
    sentry_stub: SentryIngestStub,
) -> None:
    env = {**billing_env, "SENTRY_DSN": sentry_stub.dsn, "MESSAGE_QUEUE_DRIVER": "arq"}
    row_id, _ = await a_subscription_of(worker, stripe_stub, webhook_secrets["stripe"], 5)
    stripe_stub.put_subscription("cus_linked", id="sub_1", quantity=2, **PERIOD)
    before = await snapshot(worker)

    done = await asyncio.to_thread(run_litestar, env, "webhooks", "replay", str(row_id), "--dry-run")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[2].split() == ["workspace", str(linked_workspace.id), "seat_quantity", "5", "2"]
    assert lines[-1] == "Would change 2 fields of 1 row."

    stripe_stub.remove("customer", "cus_linked")
    failed = await asyncio.to_thread(run_litestar, env, "webhooks", "replay", str(row_id), "--dry-run")
    assert failed.returncode == 1, failed.stderr
    assert failed.stdout.strip().splitlines()[-2].startswith("The handler would fail: PermanentError:")
    assert "Traceback" not in failed.stderr
    assert await snapshot(worker) == before
    assert sentry_stub.events == []  # flushed before the command exited: none was sent
