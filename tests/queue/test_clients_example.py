"""The worked example: the weekly cron queues one summary per active workspace, each sent once."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from app.clients.crons import SendWeeklySummariesCronJob
from app.clients.email import EMAIL, EmailMessage
from app.clients.jobs import SendClientSummaryJob, SendClientSummaryJobData
from app.core.resources import Resources
from app.core.settings import load_settings
from app.identity.models import AppUser, Workspace, WorkspaceMember
from app.queue.job import CronTick
from app.queue.upstreams import UpstreamHeld
from app.runtime import open_resources

ROOT = Path(__file__).resolve().parents[2]
MONDAY_8 = datetime(2030, 1, 7, 8, 0, tzinfo=UTC)


@pytest.fixture
async def sync_resources(settings_env: dict[str, str]) -> AsyncIterator[Resources]:
    resources = open_resources(load_settings({**settings_env, "MESSAGE_QUEUE_DRIVER": "sync"}), ())
    yield resources
    await resources.close()


@pytest.fixture
def outbox(monkeypatch: pytest.MonkeyPatch) -> list[EmailMessage]:
    sent: list[EmailMessage] = []

    class RecordingSender:
        async def send(self, message: EmailMessage) -> None:
            sent.append(message)

    monkeypatch.setattr(SendClientSummaryJob, "email_sender", lambda self: RecordingSender())
    return sent


async def _workspace(resources: Resources, name: str, emails: list[str], *, deleted: bool = False) -> int:
    async with resources.db.session() as session:
        workspace = Workspace(name=name, member_limit=3, deleted_at=MONDAY_8 if deleted else None)
        session.add(workspace)
        await session.flush()
        for n, email in enumerate(emails):
            user = AppUser(clerk_user_id=f"user_{name}_{n}", email=email)
            session.add(user)
            await session.flush()
            session.add(
                WorkspaceMember(clerk_membership_id=f"mem_{name}_{n}", workspace_id=workspace.id, user_id=user.id)
            )
        await session.commit()
        return workspace.id


async def test_the_weekly_cron_sends_one_summary_per_active_workspace_once(
    sync_resources: Resources, outbox: list[EmailMessage]
) -> None:
    acme = await _workspace(sync_resources, "Acme", ["b@acme.test", "a@acme.test"])
    await _workspace(sync_resources, "Globex", ["g@globex.test"])
    await _workspace(sync_resources, "Gone", ["x@gone.test"], deleted=True)

    await sync_resources.queue.add(SendWeeklySummariesCronJob, CronTick(slot=MONDAY_8))

    assert sorted((m.subject, m.to) for m in outbox) == [
        ("Your Acme summary for 2030-01-07", ("a@acme.test", "b@acme.test")),
        ("Your Globex summary for 2030-01-07", ("g@globex.test",)),
    ]
    # Run twice: the tick is done, and the email of one workspace and week is claimed.
    await sync_resources.queue.add(SendWeeklySummariesCronJob, CronTick(slot=MONDAY_8))
    await sync_resources.queue.add(
        SendClientSummaryJob, SendClientSummaryJobData(workspace_id=acme, period="2030-01-07")
    )
    assert len(outbox) == 2


async def test_a_summary_waits_while_the_mail_provider_is_held_and_goes_once_it_answers(
    settings_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the sync driver, a wait a worker would sit out (``UpstreamHeld``) is raised to the caller."""
    resources = open_resources(
        load_settings({**settings_env, "MESSAGE_QUEUE_DRIVER": "sync", "UPSTREAM_PROBE_SECONDS": "0.2"}), ()
    )
    provider = {"up": False, "sent": 0}

    class FlakySender:
        async def send(self, message: EmailMessage) -> None:
            if not provider["up"]:
                raise ConnectionError("the mail provider refused the connection")
            provider["sent"] += 1

    monkeypatch.setattr(SendClientSummaryJob, "email_sender", lambda self: FlakySender())
    try:
        workspaces = [await _workspace(resources, name, [f"a@{name}.test"]) for name in ("a", "b", "c", "d")]
        tried = []
        for workspace in workspaces:
            with pytest.raises((ConnectionError, UpstreamHeld)) as raised:
                await resources.queue.add(SendClientSummaryJob, SendClientSummaryJobData(workspace, "2030-01-07"))
            tried.append(type(raised.value))
        assert tried == [ConnectionError, ConnectionError, UpstreamHeld, UpstreamHeld]  # held after three
        assert (await EMAIL.of(resources).status()).state == "held"

        provider["up"] = True
        await asyncio.sleep(0.25)  # the probe is due: the next send is it, and its answer ends the hold
        for workspace in workspaces:
            await resources.queue.add(SendClientSummaryJob, SendClientSummaryJobData(workspace, "2030-01-07"))
        assert provider["sent"] == 4 and (await EMAIL.of(resources).status()).state == "ok"
    finally:
        await resources.close()


@pytest.mark.slow
def test_crons_list_and_crons_run_through_the_litestar_cli(settings_env: dict[str, str]) -> None:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
        **settings_env,
        "MESSAGE_QUEUE_DRIVER": "sync",
    }
    litestar = [os.path.join(os.path.dirname(sys.executable), "litestar"), "--app", "app.asgi:create_app"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*litestar, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)

    before = run("crons", "list")
    assert before.returncode == 0, before.stderr
    header, *rows = before.stdout.splitlines()
    assert header.split() == ["CRON", "PATTERN", "(UTC)", "NEXT", "TICK", "(UTC)", "LAST", "RUN"]
    line = next(line for line in rows if line.startswith("SendWeeklySummariesCronJob"))
    assert line.split()[1:6] == ["0", "8", "*", "*", "1"] and line.endswith("never")
    assert len({row.index(row.split()[1]) for row in rows}) == 1  # the patterns start in one column

    ran = run("crons", "run", "SendWeeklySummariesCronJob")
    assert ran.returncode == 0, ran.stderr
    assert "Cron SendWeeklySummariesCronJob ran." in ran.stdout

    after = run("crons", "list")
    line = next(line for line in after.stdout.splitlines() if line.startswith("SendWeeklySummariesCronJob"))
    assert line.endswith(", ok")
