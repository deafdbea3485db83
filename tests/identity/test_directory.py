"""Identity's reads for other modules: who is in a workspace, and which workspaces there are."""

from __future__ import annotations

from datetime import UTC, datetime

from app.core.resources import Resources
from app.identity.directory import active_workspace, active_workspace_ids, member_emails
from tests.factories import AppUserFactory, WorkspaceFactory, WorkspaceMemberFactory, persist

GONE = datetime(2030, 1, 1, tzinfo=UTC)


async def _member(resources: Resources, workspace_id: int, email: str | None, **membership: object) -> None:
    user = await persist(resources.db, AppUserFactory.build(email=email, deleted_at=membership.pop("user_gone", None)))
    await persist(resources.db, WorkspaceMemberFactory.build(workspace_id=workspace_id, user_id=user.id, **membership))


async def test_member_emails_are_the_members_with_an_email_sorted_whatever_their_case(resources: Resources) -> None:
    workspace = await persist(resources.db, WorkspaceFactory.build())
    other = await persist(resources.db, WorkspaceFactory.build())
    await _member(resources, workspace.id, "b@acme.test")
    await _member(resources, workspace.id, "A@acme.test")
    await _member(resources, workspace.id, "c@acme.test", suspended_at=GONE)  # beyond the seats: still a member
    await _member(resources, workspace.id, None)
    await _member(resources, workspace.id, "left@acme.test", deleted_at=GONE)
    await _member(resources, workspace.id, "deleted-user@acme.test", user_gone=GONE)
    await _member(resources, other.id, "other@globex.test")

    async with resources.db.session() as session:
        assert await member_emails(session, workspace.id) == ("A@acme.test", "b@acme.test", "c@acme.test")
        assert await member_emails(session, 404) == ()


async def test_a_deleted_or_missing_workspace_is_not_active(resources: Resources) -> None:
    workspace = await persist(resources.db, WorkspaceFactory.build(name="Acme", member_limit=5))
    deleted = await persist(resources.db, WorkspaceFactory.build(deleted_at=GONE))

    async with resources.db.session() as session:
        found = await active_workspace(session, workspace.id)
        assert found is not None and (found.id, found.name, found.member_limit) == (workspace.id, "Acme", 5)
        assert await active_workspace(session, deleted.id) is None
        assert await active_workspace(session, 404) is None


async def test_active_workspace_ids_walk_every_workspace_not_deleted_page_by_page(resources: Resources) -> None:
    kept = [(await persist(resources.db, WorkspaceFactory.build())).id for _ in range(5)]
    await persist(resources.db, WorkspaceFactory.build(deleted_at=GONE))

    pages, after_id = [], 0
    async with resources.db.session() as session:
        while page := await active_workspace_ids(session, after_id=after_id, limit=2):
            pages.append(page)
            after_id = page[-1]

    assert pages == [kept[0:2], kept[2:4], kept[4:]]
