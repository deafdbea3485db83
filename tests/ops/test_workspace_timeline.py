""" "A customer asks why", in a real headless Chromium: find the workspace by each of its keys, read its timeline
(events and the changes each made, newest first), preview a replay (nothing written), replay it, and all of it on a
phone. The pictures of docs/operations.md are taken here (``make screenshots``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from playwright.async_api import Browser

from app.billing import module as billing
from app.core.resources import Resources
from app.core.settings import load_settings
from app.identity import module as identity
from app.runtime import open_resources
from app.testing.fixtures import stripe_stub, stripe_stub_server
from app.testing.stripe_stub import StripeStub
from app.webhooks.processing import process_event
from tests.billing.test_dry_run import snapshot
from tests.ops.conftest import OPS_PASSWORD, PHONE, OpsPage, open_tab, screenshot
from tests.ops.customer_story import CUSTOMER, ORG, Story, subscription, tell
from tests.ops.test_ops_phone import LAYOUT_FAULTS
from tests.processes import logged_api_process

__all__ = ["stripe_stub", "stripe_stub_server"]
pytestmark = pytest.mark.slow


@pytest.fixture
def env(settings_env: dict[str, str], stripe_stub: StripeStub) -> dict[str, str]:
    return {**settings_env, "OPS_PASSWORD": OPS_PASSWORD, "STRIPE_API_BASE": stripe_stub.base_url}


@pytest.fixture
async def worker(env: dict[str, str]) -> AsyncIterator[Resources]:
    """What the worker does, in this process: the story's events handled, their jobs run inline."""
    resources = open_resources(
        load_settings({**env, "MESSAGE_QUEUE_DRIVER": "sync"}), [billing.MODULE, identity.MODULE]
    )
    yield resources
    await resources.close()


@pytest.fixture
def api(env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    with logged_api_process(env, tmp_path / "api.log") as base_url:
        yield base_url


@pytest.fixture
async def story(worker: Resources, stripe_stub: StripeStub, webhook_secrets: dict[str, str]) -> Story:
    return await tell(worker, stripe_stub, webhook_secrets)


async def find(ops: OpsPage, query: str) -> list[str]:
    await ops.open("/ops/workspaces")
    await ops.page.fill("input[name=q]", query)
    await ops.submit("Find")
    return [text.strip() for text in await ops.page.locator("#workspaces tbody td[data-label=Row]").all_inner_texts()]


async def test_a_customer_asks_why_the_timeline_answers_and_a_preview_changes_nothing(
    browser: Browser, api: str, worker: Resources, stripe_stub: StripeStub, story: Story, tmp_path: Path
) -> None:
    ops = await open_tab(browser, api, viewport={"width": 1100, "height": 900})
    await ops.log_in()
    for query in (str(story.workspace_id), ORG, CUSTOMER, "acme c"):  # row id, Clerk, Stripe, part of its name
        assert await find(ops, query) == [str(story.workspace_id)], query
    await ops.page.locator("#workspaces a.row-link").click()
    await ops.page.wait_for_url(f"**/ops/workspaces/{story.workspace_id}")
    await screenshot(ops.page, "ops-workspace-timeline.png", tmp_path)

    entries = ops.page.locator("#timeline > li")
    newest = entries.nth(0)  # the job the seat change queued: two members suspended, the newest first
    assert "ApplyWorkspaceMemberLimitJob" in await newest.locator("p.when").inner_text()
    assert await newest.locator("td[data-label=Column]").all_inner_texts() == ["suspended_at", "suspended_at"]
    seats = entries.nth(1)
    assert f"Event {story.seats_row}" in await seats.locator("p.when").inner_text()
    assert [" ".join(t.split()) for t in await seats.locator("tbody tr").all_inner_texts()] == [
        f"workspace {story.workspace_id} seat_quantity 5 2",
        f"workspace {story.workspace_id} member_limit 5 2",
    ]
    rename = ops.page.locator(f"#timeline > li[data-event='{story.rename_row}']")
    assert " ".join((await rename.locator("tbody tr").inner_text()).split()) == (
        f"workspace {story.workspace_id} name Acme Acme Corp"
    )
    assert ops.other_hosts() == []

    # Stripe says 6 seats now: what would replaying the seat change do?
    subscription(stripe_stub, 6)
    before = await snapshot(worker)
    await ops.page.locator(f"#timeline a[href='/ops/events/{story.seats_row}']").first.click()
    await ops.page.wait_for_url(f"**/ops/events/{story.seats_row}")
    await ops.submit("Preview replay")
    assert await snapshot(worker) == before
    rows = [" ".join(t.split()) for t in await ops.page.locator("#would-change tbody tr").all_inner_texts()]
    assert rows == [
        f"workspace {story.workspace_id} seat_quantity 2 6",
        f"workspace {story.workspace_id} member_limit 2 6",
    ]
    assert await ops.page.locator("#preview-summary").inner_text() == "Would change 2 fields of 1 row."
    assert "Would queue ApplyWorkspaceMemberLimitJob" in await ops.page.locator("#preview").inner_text()
    await screenshot(ops.page, "ops-preview-replay.png", tmp_path)

    # The replay itself: queued by the button, processed as a worker would; the timeline shows what it did.
    await ops.submit("Replay")
    assert "Replaying stripe event" in await ops.message()
    await process_event(worker, story.seats_row, "stripe")
    await ops.open(f"/ops/workspaces/{story.workspace_id}")
    replayed = ops.page.locator(f"#timeline > li[data-event='{story.seats_row}']")
    changes = [" ".join(t.split()) for t in await replayed.locator("tbody tr").all_inner_texts()]
    assert f"workspace {story.workspace_id} seat_quantity 2 6" in changes
    await ops.context.close()


async def test_the_timeline_on_a_phone_fits_the_screen(
    browser: Browser, api: str, story: Story, tmp_path: Path
) -> None:
    ops = await open_tab(browser, api, viewport=PHONE, is_mobile=True, has_touch=True)
    await ops.log_in()
    for path in (f"/ops/workspaces?q={CUSTOMER}", f"/ops/workspaces/{story.workspace_id}"):
        assert (await ops.open(path)).status == 200
        assert await ops.page.evaluate(LAYOUT_FAULTS) == [], path
    await screenshot(ops.page, "ops-workspace-timeline-phone.png", tmp_path, full_page=False)  # its first screen
    await ops.open(f"/ops/events/{story.seats_row}")
    await ops.submit("Preview replay")
    assert await ops.page.evaluate(LAYOUT_FAULTS) == []
    await ops.context.close()
