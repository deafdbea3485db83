"""As an operator meets it: a delivery fails in a real worker, its page shows why and which request brought it,
the fault is fixed, Retry is pressed, and the event is processed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser

from app.core.resources import Resources
from app.testing import signed_stripe_delivery, stripe_event, stripe_subscription
from app.testing.fixtures import stripe_stub, stripe_stub_server
from app.testing.stripe_stub import StripeStub
from app.webhooks.inbox import Inbox
from tests.factories import WorkspaceFactory, persist
from tests.ops.conftest import OPS_PASSWORD, open_tab, screenshot
from tests.processes import logged_api_process, wait_for, worker_starter

__all__ = ["stripe_stub", "stripe_stub_server"]

pytestmark = pytest.mark.slow

REQUEST_ID = "req-ops-acceptance-1"


@pytest.fixture
def env(settings_env: dict[str, str], stripe_stub: StripeStub) -> dict[str, str]:
    """Two quick tries per job, and no recovery round during the test: the operator's Retry brings it back."""
    return {
        **settings_env,
        "OPS_PASSWORD": OPS_PASSWORD,
        "STRIPE_API_BASE": stripe_stub.base_url,
        "WEBHOOK_RETRY_LIMIT": "1",
        "WEBHOOK_RETRY_BASE_SECONDS": "0.05",
        "WEBHOOK_RECOVERY_AFTER_SECONDS": "3600",
    }


@pytest.fixture
async def start_worker(env: dict[str, str]) -> AsyncIterator[Callable[..., Any]]:
    async with worker_starter(env, "--queues", "webhook-queue,billing-queue") as start:
        yield start


async def test_a_failed_event_is_retried_from_its_page_and_processed(
    browser: Browser,
    env: dict[str, str],
    start_worker: Callable[..., Any],
    stripe_stub: StripeStub,
    resources: Resources,
    webhook_secrets: dict[str, str],
    tmp_path: Path,
) -> None:
    await persist(resources.db, WorkspaceFactory.build(stripe_customer_id="cus_ops"))
    stripe_stub.put_customer("cus_ops")
    stripe_stub.put_subscription("cus_ops", id="sub_ops", quantity=7)
    stripe_stub.fail("/v1/customers", status=500, times=None)  # Stripe is down
    delivery = signed_stripe_delivery(
        stripe_event("customer.subscription.updated", stripe_subscription("cus_ops", id="sub_ops")),
        webhook_secrets["stripe"],
    )
    await start_worker()
    with logged_api_process(env, tmp_path / "api.log") as base_url:
        async with httpx.AsyncClient(base_url=base_url) as client:
            headers = {**delivery.headers, "X-Request-Id": REQUEST_ID}
            response = await client.post("/webhooks/stripe", content=delivery.body, headers=headers)
        assert response.status_code == 200
        (event,) = await Inbox(resources.db).find(delivery.event_id)
        await wait_for(lambda: _attempts(resources, event.id, 2), 30, "both tries of the job to fail")

        tab = await open_tab(browser, base_url)
        await tab.log_in()
        await tab.open(f"/ops/events?event_id={delivery.event_id}")
        async with tab.page.expect_navigation():
            await tab.page.get_by_role("link", name=str(event.id)).click()
        assert await tab.page.locator("#state").inner_text() == "failed"
        assert await tab.page.locator("#request-id").inner_text() == REQUEST_ID
        assert "stub fault" in await tab.page.locator("#last-error").inner_text()
        assert delivery.event_id in await tab.page.locator("#payload").inner_text()
        await screenshot(tab.page, "ops-event-failed.png", tmp_path)

        stripe_stub.clear_faults()  # Stripe is back
        await tab.submit("Retry")
        assert await tab.message() == f"Queued stripe event {delivery.event_id} (row {event.id})."
        await wait_for(lambda: _processed(resources, event.id), 30, "the retried event to be processed")
        await tab.page.reload()  # a GET of the event's page: the Retry answered with a redirect to it
        assert await tab.page.locator("#state").inner_text() == "processed"
        assert await tab.page.locator("#last-error").inner_text() == "none"
        assert not tab.other_hosts()
        retries = f"Operations page: retry webhook event row {event.id}, asked by 127.0.0.1."
        assert (tmp_path / "api.log").read_text().count(retries) == 1


async def _attempts(resources: Resources, row_id: int, at_least: int) -> bool:
    event = await Inbox(resources.db).get(row_id)
    return event is not None and event.attempts >= at_least


async def _processed(resources: Resources, row_id: int) -> bool:
    event = await Inbox(resources.db).get(row_id)
    return event is not None and event.processed_at is not None
