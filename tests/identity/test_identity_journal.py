"""The change journal of Clerk's events, reconciliation and retention: exactly what changed, from what, and why."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import DBAPIError

from app.core.journal import event_cause
from app.core.resources import Resources
from app.identity.models import Workspace, WorkspaceChange, WorkspaceMember
from app.identity.services import clerk_time
from app.queue.cli import run_cron_now
from app.testing import clerk_event, process_delivery, read_inbox_row, signed_clerk_delivery
from app.testing.pipeline import InboxRow
from app.webhooks.crons import WebhookRetentionCronJob
from app.webhooks.inbox import InboxUpkeep
from app.webhooks.processing import process_event
from tests.identity.test_clerk_sync import T0, membership
from tests.journal import Change, journal


async def deliver(resources: Resources, secret: str, event_type: str, timestamp: int, **data: Any) -> InboxRow:
    delivery = signed_clerk_delivery(clerk_event(event_type, timestamp=timestamp, **data), secret)
    row = await process_delivery(resources, delivery)
    assert row.processed, row.last_error
    return row


async def replay(resources: Resources, row_id: int) -> None:
    """What ``webhooks replay`` makes the worker do: the same event processed again."""
    await InboxUpkeep(resources.db).reset_for_replay(row_id)
    await process_event(resources, row_id, "clerk")


def times(values: list[Any]) -> list[datetime | None]:
    """A journaled time as a time (JSON holds it as an ISO string)."""
    return [datetime.fromisoformat(value) if value is not None else None for value in values]


async def workspace_id(resources: Resources) -> int:
    async with resources.db.session() as session:
        return int((await session.scalars(select(Workspace.id))).one())


async def test_a_rename_is_journaled_from_and_to_with_the_event_that_caused_it(
    clerk_worker: Resources, webhook_secrets: dict[str, str]
) -> None:
    secret = webhook_secrets["clerk"]
    created = await deliver(clerk_worker, secret, "organization.created", T0, id="org_1", name="Acme", slug="acme")
    renamed = await deliver(
        clerk_worker, secret, "organization.updated", T0 + 10, id="org_1", name="Acme Corp", slug="acme"
    )
    workspace = await workspace_id(clerk_worker)

    first, second = await journal(clerk_worker.db)
    assert (first.source, first.entity, first.entity_id, first.workspace_id) == (
        event_cause(created.row_id),
        "workspace",
        workspace,
        workspace,
    )
    assert first.changes["name"] == [None, "Acme"] and first.changes["member_limit"] == [None, 3]
    assert "clerk_updated_at" not in first.changes  # the version is bookkeeping, not a change
    assert second == Change(
        event_cause(renamed.row_id), "workspace", workspace, workspace, {"name": ["Acme", "Acme Corp"]}
    )


async def test_a_no_op_replay_and_a_duplicate_delivery_journal_nothing(
    clerk_worker: Resources, webhook_secrets: dict[str, str]
) -> None:
    secret = webhook_secrets["clerk"]
    delivery = signed_clerk_delivery(clerk_event("user.updated", timestamp=T0, id="user_1", first_name="Ada"), secret)
    row = await process_delivery(clerk_worker, delivery)
    (created,) = await journal(clerk_worker.db)
    assert created.changes["first_name"] == [None, "Ada"] and created.changes["clerk_user_id"] == [None, "user_1"]

    await process_delivery(clerk_worker, delivery)  # the same event delivered again: stored once
    await replay(clerk_worker, row.row_id)  # the same data applied again

    assert len(await journal(clerk_worker.db)) == 1


async def test_a_user_change_names_only_the_columns_it_changed_and_no_workspace(
    clerk_worker: Resources, webhook_secrets: dict[str, str]
) -> None:
    secret = webhook_secrets["clerk"]
    await deliver(clerk_worker, secret, "user.created", T0, id="user_1", first_name="Ada", last_name="Lovelace")
    later = await deliver(
        clerk_worker, secret, "user.updated", T0 + 5, id="user_1", first_name="Augusta", last_name="Lovelace"
    )
    deleted = await deliver(clerk_worker, secret, "user.deleted", T0 + 9, id="user_1")

    _, updated, gone = await journal(clerk_worker.db)
    assert (updated.source, updated.workspace_id, updated.changes) == (
        event_cause(later.row_id),
        None,
        {"first_name": ["Ada", "Augusta"]},
    )
    assert (gone.source, list(gone.changes)) == (event_cause(deleted.row_id), ["deleted_at"])
    assert times(gone.changes["deleted_at"]) == [None, clerk_time(T0 + 9)]


async def test_a_member_joining_a_full_workspace_journals_the_membership_and_its_suspension(
    clerk_worker: Resources, webhook_secrets: dict[str, str]
) -> None:
    secret = webhook_secrets["clerk"]
    for n in range(4):  # the free plan has 3 seats
        data = membership("org_1", f"user_{n}", id=f"orgmem_{n}", created_at=T0 + n)
        last = await deliver(clerk_worker, secret, "organizationMembership.created", T0 + n, **data)
    workspace = await workspace_id(clerk_worker)
    async with clerk_worker.db.session() as session:
        newest = (await session.scalars(select(WorkspaceMember).order_by(WorkspaceMember.id.desc()))).first()
    assert newest is not None and newest.suspended_at is not None

    caused = [change for change in await journal(clerk_worker.db) if change.source == event_cause(last.row_id)]
    # The user's minimal row, the membership, then its suspension: two statements wrote the member's row.
    assert [(change.entity, change.workspace_id) for change in caused] == [
        ("app_user", None),
        ("workspace_member", workspace),
        ("workspace_member", workspace),
    ]
    assert caused[1].changes["clerk_membership_id"] == [None, "orgmem_3"]
    assert list(caused[2].changes) == ["suspended_at"]
    assert times(caused[2].changes["suspended_at"]) == [None, newest.suspended_at]

    data = membership("org_1", "user_0", id="orgmem_0")
    left = await deliver(clerk_worker, secret, "organizationMembership.deleted", T0 + 10, **data)
    caused = [change for change in await journal(clerk_worker.db) if change.source == event_cause(left.row_id)]
    assert [(list(change.changes), change.entity_id) for change in caused] == [
        (["deleted_at"], caused[0].entity_id),
        (["suspended_at"], newest.id),  # the seat freed goes to the newest
    ]
    assert times(caused[0].changes["deleted_at"]) == [None, clerk_time(T0 + 10)]
    assert times(caused[1].changes["suspended_at"]) == [newest.suspended_at, None]


async def test_a_handler_that_fails_after_writing_leaves_no_journal_row(
    clerk_worker: Resources, webhook_secrets: dict[str, str]
) -> None:
    """The membership's workspace and user are written (and journaled), then its own row is refused: all rolled back."""
    data = membership("org_1", "user_1", id="orgmem_1", role="r" * 65)  # longer than the column
    delivery = signed_clerk_delivery(
        clerk_event("organizationMembership.created", timestamp=T0, **data), webhook_secrets["clerk"]
    )
    with pytest.raises(DBAPIError, match="value too long"):
        await process_delivery(clerk_worker, delivery)

    row = await read_inbox_row(clerk_worker.db, "clerk", delivery.event_id)
    assert row is not None and not row.processed and row.attempts == 1
    async with clerk_worker.db.session() as session:
        assert await session.scalar(select(func.count()).select_from(Workspace)) == 0
    assert await journal(clerk_worker.db) == []


async def test_the_retention_cron_deletes_only_journal_rows_past_their_days(
    clerk_worker: Resources, webhook_secrets: dict[str, str]
) -> None:
    secret = webhook_secrets["clerk"]
    for n in range(3):
        await deliver(clerk_worker, secret, "user.updated", T0 + n, id="user_1", first_name=f"Name {n}")
    async with clerk_worker.db.session() as session:  # the first two written long ago (91 and 95 days)
        ids = (await session.scalars(select(WorkspaceChange.id).order_by(WorkspaceChange.id))).all()
        for row_id, days in zip(ids, (95, 91), strict=False):
            await session.execute(
                text("UPDATE workspace_change SET at = now() - make_interval(days => :d) WHERE id = :id"),
                {"d": days, "id": row_id},
            )
        await session.commit()

    await run_cron_now(clerk_worker, WebhookRetentionCronJob)  # WORKSPACE_CHANGE_RETENTION_DAYS: 90

    (kept,) = await journal(clerk_worker.db)
    assert kept.changes["first_name"] == ["Name 1", "Name 2"]


async def test_rows_within_the_retention_days_are_kept(
    clerk_worker: Resources, webhook_secrets: dict[str, str]
) -> None:
    await deliver(clerk_worker, webhook_secrets["clerk"], "user.updated", T0, id="user_1", first_name="Ada")
    async with clerk_worker.db.session() as session:
        await session.execute(text("UPDATE workspace_change SET at = now() - interval '89 days'"))
        await session.commit()

    await run_cron_now(clerk_worker, WebhookRetentionCronJob)

    assert len(await journal(clerk_worker.db)) == 1
    assert datetime.now(UTC) - timedelta(days=90) < (await _oldest(clerk_worker))


async def _oldest(resources: Resources) -> datetime:
    async with resources.db.session() as session:
        return await session.scalar(select(func.min(WorkspaceChange.at)))  # type: ignore[return-value]
