"""Two real workers and the ``stripe`` upstream: a hold both obey while Clerk events go on, drained at the budget's
rate once a probe finds Stripe answering; and an operator's pause from the CLI, obeyed by both within a second."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from app.billing.budget import STRIPE
from app.core.resources import Resources
from app.identity import module as identity
from app.identity.models import AppUser
from app.testing import clerk_event, signed_clerk_delivery
from app.testing.processes import child_env
from app.testing.stripe_stub import StripeStub
from app.webhooks.handlers import event_keys
from app.webhooks.inbox import Inbox
from app.webhooks.jobs import queue_processing
from app.webhooks.payload import decode_payload
from tests.billing.conftest import OpenResources, health_checks_since, store, subscription_delivery
from tests.billing.test_stripe_budget import most_in_window, processed
from tests.factories import WorkspaceFactory, persist
from tests.processes import WorkerProc, wait_for, worker_starter

pytestmark = pytest.mark.slow(60)
ROOT = Path(__file__).resolve().parents[2]
RATE = 5


async def backlog(
    intake: Resources, stub: StripeStub, secret: str, customers: Sequence[str], *, queued: bool = True
) -> list[int]:
    """A linked workspace and one subscription event per customer, stored and queued as the API does."""
    rows = []
    for customer in customers:
        stub.put_customer(customer)
        stub.put_subscription(customer, quantity=3)
        await persist(intake.db, WorkspaceFactory.build(stripe_customer_id=customer))
        rows.append(await store(intake, subscription_delivery(secret, customer)))
        if queued:
            await queue_processing(intake.queue, "stripe", rows[-1])
    return rows


async def clerk_users(intake: Resources, secret: str, count: int) -> list[str]:
    """``user.created`` events stored and queued as the API does; the users' Clerk ids."""
    users = []
    for n in range(count):
        event = clerk_event("user.created", id=f"user_during_hold_{n}")
        delivery = signed_clerk_delivery(event, secret)
        keys = event_keys([identity.MODULE], "clerk")(delivery.event_type, decode_payload(delivery.body))
        stored = await Inbox(intake.db).store(
            "clerk", delivery.event_id, delivery.event_type, delivery.body.decode(), tenant_key=keys.tenant
        )
        await queue_processing(intake.queue, "clerk", stored.row_id)
        users.append(str(event["data"]["id"]))
    return users


async def users_stored(intake: Resources, users: list[str]) -> bool:
    async with intake.db.session() as session:
        found = {user.clerk_user_id for user in (await session.execute(AppUser.__table__.select())).all()}
    return set(users) <= found


def lines_with(workers: Sequence[WorkerProc], fragment: str) -> list[str]:
    return [line for worker in workers for line in worker.text().splitlines() if fragment in line]


@pytest.fixture
def hold_env(billing_env: dict[str, str]) -> dict[str, str]:
    return {
        **billing_env,
        "MESSAGE_QUEUE_DRIVER": "arq",
        "STRIPE_API_RATE_LIMIT_PER_SECOND": str(RATE),
        "UPSTREAM_PROBE_SECONDS": "2",
        "WEBHOOK_RETRY_BASE_SECONDS": "0.2",
    }


async def test_a_stripe_hold_is_obeyed_by_two_workers_clerk_goes_on_and_the_probe_drains_it_at_the_rate(
    hold_env: dict[str, str], open_resources: OpenResources, stripe_stub: StripeStub, webhook_secrets: dict[str, str]
) -> None:
    intake = await open_resources(**hold_env)
    stripe_stub.fail("/v1", status=500, times=None)
    rows = await backlog(intake, stripe_stub, webhook_secrets["stripe"], [f"cus_hold_{n}" for n in range(30)])
    async with worker_starter(hold_env) as start:
        workers = await asyncio.gather(start(), start())
        await wait_for(lambda: all(w.has("Upstream stripe is held after an outage") for w in workers), 60, "both")
        await wait_for(lambda: lines_with(workers, "Upstream stripe is held: "), 30, "the hold's alert")
        assert (await STRIPE.of(intake).status()).state == "held"
        calls_when_held = len(stripe_stub.requests)
        assert 3 + 1 <= calls_when_held <= 3 + 1 + 2  # the failures that held it, the health check that confirmed
        # it (and calls already in flight)

        users = await clerk_users(intake, webhook_secrets["clerk"], 5)  # another provider meanwhile
        await wait_for(lambda: users_stored(intake, users), 30, "the Clerk events to be processed")
        await asyncio.sleep(4)  # two probe intervals at least: one probe each, nothing else
        probes = health_checks_since(stripe_stub, calls_when_held, in_flight=2)  # and calls under way when it held
        assert most_in_window(probes, 2 - 0.01) == 1, probes  # one per interval, however long the wait
        assert (await STRIPE.of(intake).status()).state == "held"

        stripe_stub.clear_faults()
        recovered = time.monotonic()
        await wait_for(lambda: processed(intake, rows), 60, "the backlog to drain after the probe's success")
        drained = time.monotonic() - recovered
        alerts = lines_with(workers, "Upstream stripe is held: 3 different subjects failed in a row")
        ended = lines_with(workers, "Upstream stripe answers again")
    after = [at for at in stripe_stub.request_times if at >= recovered]
    assert most_in_window(after, 1.0) <= RATE + 1  # at the budget's rate, not in a burst
    assert drained < 2 + 30 / RATE + 10  # the next probe, then the 30 reads at 5 a second (and slack for CI)
    assert len(alerts) == 1 and len(ended) == 1, (alerts, ended)
    # One attempt each (the read that processed it), and one more for the events whose read failed before
    # the hold: none was spent while held.
    attempts = [row.attempts for row in [await Inbox(intake.db).get(r) for r in rows] if row is not None]
    assert len(attempts) == 30 and set(attempts) <= {1, 2} and attempts.count(2) <= 2 + 2, attempts


def run_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    litestar = [os.path.join(os.path.dirname(sys.executable), "litestar"), "--app", "app.asgi:create_app"]
    return subprocess.run([*litestar, *args], cwd=ROOT, env=child_env(env), capture_output=True, text=True, timeout=60)


def said(done: subprocess.CompletedProcess[str]) -> str:
    """A command's error as one line (the CLI draws it in a box, wrapped to the terminal's width)."""
    return " ".join(done.stderr.replace("│", " ").split())


async def calls_after(stub: StripeStub, moment: float, within: float) -> bool:
    """Whether a Stripe call arrives later than ``moment`` (monotonic), waiting up to ``within`` seconds."""
    try:
        await wait_for(lambda: any(at > moment for at in stub.request_times), within, "a Stripe call")
    except AssertionError:
        return False
    return True


async def test_a_pause_from_the_cli_stops_two_workers_calls_within_a_second_and_resume_or_its_end_starts_them(
    hold_env: dict[str, str], open_resources: OpenResources, stripe_stub: StripeStub, webhook_secrets: dict[str, str]
) -> None:
    """Each command takes seconds to start on a loaded machine: the backlog lasts a minute at 2 reads a second,
    and every check is timed from the moment the command returned (or began)."""
    env = {**hold_env, "UPSTREAM_PROBE_SECONDS": "1", "STRIPE_API_RATE_LIMIT_PER_SECOND": "2"}
    intake = await open_resources(**env)
    rows = await backlog(intake, stripe_stub, webhook_secrets["stripe"], [f"cus_pause_{n}" for n in range(120)])
    async with worker_starter(env) as start:
        workers = await asyncio.gather(start(), start())
        await wait_for(lambda: len(stripe_stub.requests) >= 3, 30, "the first Stripe calls")

        paused = run_cli(env, "upstreams", "pause", "stripe")
        stopped = time.monotonic()
        assert paused.returncode == 0 and paused.stdout.splitlines()[-1] == "Paused stripe until resumed.", paused
        assert not await calls_after(stripe_stub, stopped + 1.0, within=3.0)  # none later than a second after

        asked = time.monotonic()
        resumed = run_cli(env, "upstreams", "resume", "stripe")
        assert resumed.returncode == 0 and resumed.stdout.splitlines()[-1] == "Resumed stripe.", resumed
        assert await calls_after(stripe_stub, asked, within=15.0)  # the waiting syncs go on

        for_a_while = run_cli(env, "upstreams", "pause", "stripe", "--for", "8s")
        stopped = time.monotonic()
        assert for_a_while.returncode == 0 and for_a_while.stdout.startswith("Paused stripe until "), for_a_while
        assert not await calls_after(stripe_stub, stopped + 1.0, within=2.0)
        assert await calls_after(stripe_stub, stopped + 1.0, within=20.0)  # its end lets them go again
        assert lines_with(workers, "Upstream stripe is paused")  # the syncs waited, told why
    done = [row for row in [await Inbox(intake.db).get(r) for r in rows] if row is not None and row.processed_at]
    assert done and all(row.attempts == 1 and row.abandoned_at is None for row in done)


def test_upstreams_commands_name_the_known_ones_for_an_unknown_name_and_refuse_a_wrong_duration(
    settings_env: dict[str, str],
) -> None:
    listed = run_cli(settings_env, "upstreams", "list")
    assert listed.returncode == 0, listed.stderr
    header, *lines = listed.stdout.splitlines()
    assert header.split() == ["UPSTREAM", "RATE", "WAITING", "STATE"]
    assert [line.split()[:4] for line in lines] == [
        ["clerk", "10/s", "0", "jobs"],
        ["email", "10/s", "0", "jobs"],
        ["stripe", "20/s", "0", "jobs"],
    ]
    assert all(line.endswith("  ok") for line in lines)
    unknown = run_cli(settings_env, "upstreams", "pause", "stirpe")
    assert unknown.returncode != 0
    assert "No upstream named 'stirpe'; the known upstreams are: clerk, email, stripe." in said(unknown)
    wrong = run_cli(settings_env, "upstreams", "pause", "stripe", "--for", "two hours")
    assert wrong.returncode != 0 and "'two hours' is not a duration: give one like 30m, 2h or 7d." in said(wrong)
