"""The "Try it" of docs/operations.md, step by step, as a newcomer follows it: the try-it pair is sent
(`make send-test-webhook SAMPLE=checkout`), the checkout fails in a real worker because no Stripe API answers,
its page shows why and which request brought it, the local Stripe is started (`make stripe-stub`), Retry is
pressed, and the event is processed; the guide's `make psql` query shows the workspace linked with its seats,
and /metrics shows the counts moving."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser
from sqlalchemy import select

from app.core.resources import Resources
from app.identity.models import Workspace
from app.testing.processes import child_env, free_port
from app.webhooks.inbox import Inbox
from tests.ops.conftest import OPS_PASSWORD, open_tab, screenshot
from tests.ops.test_metrics import samples, value
from tests.processes import ROOT, logged_api_process, stop, wait_for, worker_starter
from tools.dev_stripe import TRY_CHECKOUT, TRY_CUSTOMER, TRY_ORGANIZATION, TRY_SEATS

pytestmark = pytest.mark.slow


@pytest.fixture
def stub_port() -> int:
    return free_port()


@pytest.fixture
def env(settings_env: dict[str, str], stub_port: int) -> dict[str, str]:
    """As `make dev` runs: the Stripe API is the local stub's address, where nothing answers yet. The retries
    wait a minute, so the worker's own retry does not beat the operator's button."""
    return {
        **settings_env,
        "OPS_PASSWORD": OPS_PASSWORD,
        "STRIPE_API_BASE": f"http://127.0.0.1:{stub_port}",
        "STRIPE_STUB_PORT": str(stub_port),
        "WEBHOOK_RETRY_BASE_SECONDS": "60",
    }


@pytest.fixture
async def start_worker(env: dict[str, str]) -> AsyncIterator[Callable[..., Any]]:
    async with worker_starter(env) as start:  # every queue, as `make dev`'s worker
        yield start


def documented_query() -> str:
    """The statement of the `make psql SQL="..."` line that "Try it" gives to see the linked workspace."""
    lines = (Path(ROOT) / "docs" / "operations.md").read_text().splitlines()
    (line,) = [line.strip() for line in lines if line.strip().startswith("make psql SQL=") and TRY_ORGANIZATION in line]
    return shlex.split(line)[2].removeprefix("SQL=")


def run_tool(env: dict[str, str], *args: str) -> str:
    """``python -m tools.X ...`` as its make target runs it (make's dev env is ``env`` here)."""
    done = subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, env=child_env(env), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture
def stripe_stub_process(env: dict[str, str]) -> Iterator[Callable[[], None]]:
    """`make stripe-stub`, started when the test calls it."""
    started: list[subprocess.Popen[str]] = []

    def start() -> None:
        process = subprocess.Popen(
            [sys.executable, "-m", "tools.dev_stripe"],
            cwd=ROOT,
            env=child_env(env),
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        started.append(process)
        assert process.stdout is not None
        assert process.stdout.readline().startswith(f"Stripe stub: {env['STRIPE_API_BASE']} ")

    yield start
    for process in started:
        stop(process)


async def test_try_it_a_failed_checkout_is_retried_from_its_page_and_processed(
    browser: Browser,
    env: dict[str, str],
    start_worker: Callable[..., Any],
    stripe_stub_process: Callable[[], None],
    resources: Resources,
    tmp_path: Path,
) -> None:
    await start_worker()
    with logged_api_process(env, tmp_path / "api.log") as base_url:
        sent = run_tool(env, "tools.send_test_webhook", "--sample", "checkout", "--url", base_url).splitlines()
        assert sent[0].startswith("Sent clerk organization.created event ") and ": HTTP 200 " in sent[0]
        assert sent[1].startswith("Sent stripe checkout.session.completed event ")
        assert "run `make stripe-stub` in another shell, then press Retry" in sent[2]
        event_id = sent[1].split()[4].rstrip(":")
        (event,) = await Inbox(resources.db).find(event_id)
        await wait_for(lambda: _attempts(resources, event.id, 1), 30, "the checkout's first try to fail")
        await wait_for(lambda: _workspace(resources), 30, "the organization's workspace")

        tab = await open_tab(browser, base_url)
        await tab.log_in()
        failed = tab.page.locator('#inbox tr[data-provider="stripe"] [data-count="failed"] a')
        assert await failed.inner_text() == "1"
        async with tab.page.expect_navigation():
            await failed.click()
        async with tab.page.expect_navigation():
            await tab.page.get_by_role("link", name=str(event.id)).click()
        assert await tab.page.locator("#state").inner_text() == "failed"
        assert await tab.page.locator("#request-id").inner_text() == event.request_id
        error = await tab.page.locator("#last-error").inner_text()
        assert env["STRIPE_API_BASE"] in error and TRY_CHECKOUT in error, error
        assert TRY_CHECKOUT in await tab.page.locator("#payload").inner_text()
        await screenshot(tab.page, "ops-event-failed.png", tmp_path)

        stripe_stub_process()  # the fix: `make stripe-stub`
        await tab.submit("Retry")
        assert (await tab.message()).startswith(f"Queued stripe event {event_id} (row {event.id})")
        await wait_for(lambda: _processed(resources, event.id), 30, "the retried checkout to be processed")
        await tab.page.reload()  # a GET of the event's page: the Retry answered with a redirect to it
        assert await tab.page.locator("#state").inner_text() == "processed"
        assert await tab.page.locator("#last-error").inner_text() == "none"
        assert not tab.other_hosts()
        retries = f"Operations page: retry webhook event row {event.id}, asked by 127.0.0.1."
        assert (tmp_path / "api.log").read_text().count(retries) == 1

        workspace = await _workspace(resources)
        assert workspace is not None
        assert (workspace.stripe_customer_id, workspace.seat_quantity) == (TRY_CUSTOMER, TRY_SEATS)
        shown = run_tool({**env, "SQL": documented_query()}, "tools.psql").splitlines()  # `make psql SQL="..."`
        assert [cell.strip() for cell in shown[2].split("|")] == [TRY_ORGANIZATION, TRY_CUSTOMER, "5", "5"], shown
        async with httpx.AsyncClient() as client:
            metrics = samples((await client.get(f"{base_url}/metrics", timeout=5)).text)
        for provider in ("stripe", "clerk"):
            assert value(metrics, "webhook_deliveries_total", provider=provider, outcome="stored") == 1
            for state in ("pending", "failed", "set_aside"):
                assert value(metrics, "webhook_inbox_events", provider=provider, state=state) == 0


async def _attempts(resources: Resources, row_id: int, at_least: int) -> bool:
    event = await Inbox(resources.db).get(row_id)
    return event is not None and event.attempts >= at_least and event.last_error is not None


async def _processed(resources: Resources, row_id: int) -> bool:
    event = await Inbox(resources.db).get(row_id)
    return event is not None and event.processed_at is not None


async def _workspace(resources: Resources) -> Workspace | None:
    async with resources.db.session() as session:
        found: Workspace | None = await session.scalar(
            select(Workspace).where(Workspace.clerk_org_id == TRY_ORGANIZATION)
        )
        return found
