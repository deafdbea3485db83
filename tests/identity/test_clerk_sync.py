"""Clerk events applied in any order: newest change wins, deletions stick, memberships may come first."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from app.core.resources import Resources
from app.identity.models import AppUser, Workspace, WorkspaceMember
from app.identity.services import clerk_time
from app.testing import clerk_event, process_delivery, signed_clerk_delivery

T0 = 1_750_000_000_000  # Clerk times are unix milliseconds


async def deliver(resources: Resources, secret: str, event_type: str, timestamp: int, **data: Any) -> None:
    row = await process_delivery(
        resources, signed_clerk_delivery(clerk_event(event_type, timestamp=timestamp, **data), secret)
    )
    assert row.processed, row.last_error


def membership(org_id: str, user_id: str, **fields: Any) -> dict[str, Any]:
    """The parts of a membership event that name its organization and user."""
    base = clerk_event("organizationMembership.created")["data"]
    return {
        "organization": {**base["organization"], "id": org_id, "name": "Name carried by the membership"},
        "public_user_data": {**base["public_user_data"], "user_id": user_id, "first_name": "Carried"},
        **fields,
    }


async def one(resources: Resources, model: Any) -> Any:
    async with resources.db.session() as session:
        return (await session.scalars(select(model))).one()


async def test_membership_first_creates_minimal_rows_that_their_own_events_fill_in(
    clerk_worker: Resources, webhook_secrets: dict[str, str]
) -> None:
    secret = webhook_secrets["clerk"]
    await deliver(
        clerk_worker,
        secret,
        "organizationMembership.created",
        T0 + 30,
        id="orgmem_1",
        role="org:admin",
        **membership("org_1", "user_1"),
    )

    workspace, user, member = (
        await one(clerk_worker, Workspace),
        await one(clerk_worker, AppUser),
        await one(clerk_worker, WorkspaceMember),
    )
    assert (workspace.clerk_org_id, workspace.clerk_updated_at, workspace.member_limit) == ("org_1", None, 3)
    assert (user.clerk_user_id, user.first_name, user.clerk_updated_at) == ("user_1", "Carried", None)
    assert (member.workspace_id, member.user_id, member.role) == (workspace.id, user.id, "org:admin")

    await deliver(clerk_worker, secret, "organization.created", T0 + 10, id="org_1", name="Acme", slug="acme")
    await deliver(clerk_worker, secret, "user.created", T0 + 20, id="user_1", first_name="Ada")

    workspace, user = await one(clerk_worker, Workspace), await one(clerk_worker, AppUser)
    assert (workspace.name, workspace.slug, workspace.clerk_updated_at) == ("Acme", "acme", clerk_time(T0 + 10))
    assert (user.first_name, user.clerk_updated_at) == ("Ada", clerk_time(T0 + 20))


async def test_an_older_update_neither_overwrites_a_newer_one_nor_revives_a_deleted_user(
    clerk_worker: Resources, webhook_secrets: dict[str, str]
) -> None:
    secret = webhook_secrets["clerk"]
    await deliver(clerk_worker, secret, "user.updated", T0 + 20, id="user_1", first_name="Newer")
    await deliver(clerk_worker, secret, "user.deleted", T0 + 30, id="user_1")
    await deliver(clerk_worker, secret, "user.updated", T0 + 10, id="user_1", first_name="Older")

    user = await one(clerk_worker, AppUser)
    assert (user.first_name, user.clerk_updated_at, user.deleted_at) == (
        "Newer",
        clerk_time(T0 + 20),
        clerk_time(T0 + 30),
    )


async def seats(resources: Resources) -> list[tuple[str, str]]:
    async with resources.db.session() as session:
        members = (await session.scalars(select(WorkspaceMember).order_by(WorkspaceMember.id))).all()
    return [
        (m.clerk_membership_id, "left" if m.deleted_at else "suspended" if m.suspended_at else "seated")
        for m in members
    ]


async def test_a_member_joining_a_full_workspace_is_suspended_and_regains_a_seat_when_one_leaves(
    clerk_worker: Resources, webhook_secrets: dict[str, str]
) -> None:
    secret = webhook_secrets["clerk"]
    for n in range(4):  # the free plan has 3 seats
        data = membership("org_1", f"user_{n}", id=f"orgmem_{n}", created_at=T0 + n)
        await deliver(clerk_worker, secret, "organizationMembership.created", T0 + n, **data)
    assert [state for _, state in await seats(clerk_worker)] == ["seated", "seated", "seated", "suspended"]

    data = membership("org_1", "user_0", id="orgmem_0")
    await deliver(clerk_worker, secret, "organizationMembership.deleted", T0 + 10, **data)

    assert [state for _, state in await seats(clerk_worker)] == ["left", "seated", "seated", "seated"]


@pytest.mark.parametrize(
    ("kind", "model", "field"), [("user", AppUser, "first_name"), ("organization", Workspace, "name")]
)
async def test_no_change_older_than_or_as_old_as_a_deletion_writes_the_deleted_row(
    clerk_worker: Resources, webhook_secrets: dict[str, str], kind: str, model: Any, field: str
) -> None:
    """A deletion is the newest change of its object: a late update it followed writes nothing."""
    secret = webhook_secrets["clerk"]
    await deliver(clerk_worker, secret, f"{kind}.created", T0 + 10, id="clerk_1", **{field: "Created"})
    await deliver(clerk_worker, secret, f"{kind}.deleted", T0 + 30, id="clerk_1")
    await deliver(clerk_worker, secret, f"{kind}.updated", T0 + 20, id="clerk_1", **{field: "Late"})
    await deliver(clerk_worker, secret, f"{kind}.updated", T0 + 30, id="clerk_1", **{field: "At deletion"})

    row = await one(clerk_worker, model)
    assert (getattr(row, field), row.clerk_updated_at, row.deleted_at) == (
        "Created",
        clerk_time(T0 + 10),
        clerk_time(T0 + 30),
    )


async def test_a_late_change_writes_no_field_of_a_deleted_minimal_row(
    clerk_worker: Resources, webhook_secrets: dict[str, str]
) -> None:
    """A row first seen through a membership has no version; its deletion still stops older changes."""
    secret = webhook_secrets["clerk"]
    data = membership("org_1", "user_1", id="orgmem_1", role="org:admin")
    await deliver(clerk_worker, secret, "organizationMembership.created", T0 + 5, **data)
    await deliver(clerk_worker, secret, "user.deleted", T0 + 30, id="user_1")
    await deliver(clerk_worker, secret, "user.created", T0 + 10, id="user_1", first_name="Late")

    user = await one(clerk_worker, AppUser)
    assert (user.first_name, user.clerk_updated_at, user.deleted_at) == ("Carried", None, clerk_time(T0 + 30))


async def test_a_late_update_of_a_deleted_membership_changes_neither_its_role_nor_its_links(
    clerk_worker: Resources, webhook_secrets: dict[str, str]
) -> None:
    secret = webhook_secrets["clerk"]
    created = membership("org_1", "user_1", id="orgmem_1", role="org:admin")
    await deliver(clerk_worker, secret, "organizationMembership.created", T0 + 10, **created)
    await deliver(clerk_worker, secret, "organizationMembership.deleted", T0 + 30, **created)
    late = membership("org_2", "user_2", id="orgmem_1", role="org:member")  # names other rows on purpose
    await deliver(clerk_worker, secret, "organizationMembership.updated", T0 + 20, **late)

    async with clerk_worker.db.session() as session:
        member = (await session.scalars(select(WorkspaceMember))).one()
        workspace = await session.get(Workspace, member.workspace_id)
        user = await session.get(AppUser, member.user_id)
    assert workspace is not None and user is not None
    assert (member.role, workspace.clerk_org_id, user.clerk_user_id) == ("org:admin", "org_1", "user_1")
    assert (member.clerk_updated_at, member.deleted_at) == (clerk_time(T0 + 10), clerk_time(T0 + 30))


async def test_a_change_as_new_as_the_stored_one_applies_again(
    clerk_worker: Resources, webhook_secrets: dict[str, str]
) -> None:
    """Same version, other data (a replay after a handler fix reads the payload differently): it is written."""
    secret = webhook_secrets["clerk"]
    await deliver(clerk_worker, secret, "user.updated", T0 + 10, id="user_1", first_name="Before the fix")
    await deliver(clerk_worker, secret, "user.updated", T0 + 10, id="user_1", first_name="After the fix")

    user = await one(clerk_worker, AppUser)
    assert (user.first_name, user.clerk_updated_at) == ("After the fix", clerk_time(T0 + 10))
