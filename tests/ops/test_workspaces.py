"""A workspace's timeline, read without a browser: order, pages, its changes beside their events, refusals, and
``litestar workspaces timeline`` printing the same."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy import insert

from app.core.journal import event_cause
from app.core.resources import Resources
from app.identity.models import WorkspaceChange
from app.webhooks.models import WebhookEvent
from tests.factories import WorkspaceFactory, persist
from tests.ops.conftest import ops_client
from tests.processes import ROOT

_ENTRY = re.compile(
    r'<li class="entry (event|change)" data-(?:event|source)="([^"]+)">\s*<p class="when"><time datetime="([^"]+)"'
)
T0 = datetime(2026, 11, 1, tzinfo=UTC)
# An entry's line of `workspaces timeline`: its time, then an event or the cause of changes (a change's own line is
# indented further).
_PRINTED_ENTRY = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d  (?:event (\d+)  |by (\S+)$)")


async def a_busy_workspace(resources: Resources, events: int = 60) -> int:
    """``events`` events of its customer and organization a minute apart, each changing it a second later; every
    fifth minute a job changes one of its members too."""
    workspace = await persist(
        resources.db, WorkspaceFactory.build(clerk_org_id="org_busy", stripe_customer_id="cus_busy", name="Busy")
    )
    other = await persist(
        resources.db, WorkspaceFactory.build(clerk_org_id="org_other", stripe_customer_id="cus_other", name="Other")
    )
    rows = [
        WebhookEvent(
            provider="stripe" if n % 2 else "clerk",
            event_id=f"evt_busy_{n}",
            type="customer.subscription.updated" if n % 2 else "organization.updated",
            payload={"id": f"evt_busy_{n}"},
            received_at=T0 + timedelta(minutes=n),
            processed_at=T0 + timedelta(minutes=n, seconds=2),
            attempts=1,
            tenant_key="cus_busy" if n % 2 else "org:org_busy",
        )
        for n in range(events)
    ]
    rows.append(
        WebhookEvent(provider="stripe", event_id="evt_other", type="invoice.paid", payload={}, tenant_key="cus_other")
    )
    async with resources.db.session() as session:
        session.add_all(rows)
        await session.flush()
        changes = (
            [
                {
                    "workspace_id": workspace.id,
                    "at": row.received_at + timedelta(seconds=1),
                    "source": event_cause(row.id),
                    "entity": "workspace",
                    "entity_id": workspace.id,
                    "changes": {"seat_quantity": [n, n + 1]},
                }
                for n, row in enumerate(rows[:events])
            ]
            + [
                {
                    "workspace_id": workspace.id,
                    "at": T0 + timedelta(minutes=n, seconds=30),
                    "source": "ApplyWorkspaceMemberLimitJob",
                    "entity": "workspace_member",
                    "entity_id": 7,
                    "changes": {"suspended_at": [None, (T0 + timedelta(minutes=n)).isoformat()]},
                }
                for n in range(0, events, 5)
            ]
            + [
                {
                    "workspace_id": other.id,
                    "at": T0,
                    "source": "ApplyWorkspaceMemberLimitJob",
                    "entity": "workspace",
                    "entity_id": other.id,
                    "changes": {"name": ["a", "b"]},
                }
            ]
        )
        await session.execute(insert(WorkspaceChange), changes)
        await session.commit()
    return workspace.id


def entries(html: str) -> list[tuple[str, str, datetime]]:
    return [(kind, key, datetime.fromisoformat(at)) for kind, key, at in _ENTRY.findall(html)]


async def test_the_timeline_pages_newest_first_with_each_events_change_beside_it(
    ops_api: str, resources: Resources
) -> None:
    workspace = await a_busy_workspace(resources)
    seen: list[tuple[str, str, datetime]] = []
    async with ops_client(ops_api) as ops:
        path: str | None = f"/ops/workspaces/{workspace}"
        pages = 0
        while path is not None:
            page = await ops.client.get(path)
            assert page.status_code == 200
            found = entries(page.text)
            assert 0 < len(found) <= 50
            for kind, key, _ in found:
                if kind == "event":  # its change is in its card
                    card = page.text.split(f'data-event="{key}"')[1].split("</li>")[0]
                    assert "seat_quantity" in card.replace("<wbr>", "")
            seen += found
            pages += 1
            older = re.search(r'<a rel="next" class="more" href="([^"]+)"', page.text)
            path = older.group(1).replace("&amp;", "&") if older else None
    assert pages == 2
    assert [at for _, _, at in seen] == sorted((at for _, _, at in seen), reverse=True)
    events = [key for kind, key, _ in seen if kind == "event"]
    assert len(events) == len(set(events)) == 60  # each event once, none of the other workspace's
    jobs = [at for kind, key, at in seen if kind == "change"]
    assert len(jobs) == 12 and all(key == "ApplyWorkspaceMemberLimitJob" for kind, key, _ in seen if kind == "change")


async def test_a_workspace_is_found_by_each_of_its_keys_and_not_by_another(ops_api: str, resources: Resources) -> None:
    workspace = await a_busy_workspace(resources, events=2)
    async with ops_client(ops_api) as ops:
        for query in (str(workspace), "org_busy", "cus_busy", "bus"):
            page = await ops.client.get("/ops/workspaces", params={"q": query})
            assert re.findall(r'href="/ops/workspaces/(\d+)"', page.text) == [str(workspace)], query
        page = await ops.client.get("/ops/workspaces", params={"q": "cus_nobody"})
        assert "No workspace matches cus_nobody." in page.text


async def test_an_unknown_workspace_is_404_and_without_a_session_the_login_form(ops_api: str) -> None:
    async with ops_client(ops_api) as ops:
        for workspace in ("424242", "99999999999999999999"):
            missing = await ops.client.get(f"/ops/workspaces/{workspace}")
            assert missing.status_code == 404 and "No workspace with row id" in missing.text
        wrong = await ops.post("/ops/events/99999999999999999999/preview")
        assert wrong.status_code == 404
    async with httpx.AsyncClient(base_url=ops_api) as anonymous:
        for path in ("/ops/workspaces?q=acme", "/ops/workspaces/1"):
            answer = await anonymous.get(path)
            assert (answer.status_code, answer.headers["location"]) == (303, "/ops"), path
        assert (await anonymous.post("/ops/events/1/preview")).status_code in (303, 403)


def litestar(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    command = [os.path.join(os.path.dirname(sys.executable), "litestar"), "--app", "app.asgi:create_app", *args]
    return subprocess.run(command, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=60)


@pytest.mark.slow
async def test_the_command_prints_the_pages_entries_in_its_order(
    ops_api: str, resources: Resources, settings_env: dict[str, str]
) -> None:
    workspace = await a_busy_workspace(resources, events=12)
    async with ops_client(ops_api) as ops:
        page = entries((await ops.client.get(f"/ops/workspaces/{workspace}")).text)

    for identifier in ("cus_busy", "org_busy", str(workspace)):
        done = await asyncio.to_thread(litestar, settings_env, "workspaces", "timeline", identifier)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.strip().splitlines()
        printed = [
            ("event", found.group(1)) if found.group(1) else ("change", found.group(2))
            for found in map(_PRINTED_ENTRY.match, lines)
            if found is not None
        ]
        assert printed == [(kind, key) for kind, key, _ in page], identifier
        assert lines[-1] == f"{len(page)} entries, newest first."
        assert any("    workspace " in line and "seat_quantity 0 -> 1" in line for line in lines)
    limited = await asyncio.to_thread(litestar, settings_env, "workspaces", "timeline", "cus_busy", "--limit", "3")
    assert "Older entries: litestar workspaces timeline" in limited.stdout
    unknown = await asyncio.to_thread(litestar, settings_env, "workspaces", "timeline", "cus_nobody")
    assert (
        unknown.returncode == 1
        and "No workspace with row id, Clerk organization id or Stripe customer id" in unknown.stderr
    )
