"""The request id of the delivery that stored an event, followed into the worker: every line of the event's
processing carries it, and so does the Sentry event of its failed attempt."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from app.core.resources import Resources
from app.testing import signed_stripe_delivery, stripe_event, stripe_subscription
from app.testing.fixtures import stripe_stub, stripe_stub_server
from app.testing.stripe_stub import StripeStub
from app.webhooks.inbox import Inbox
from tests.factories import WorkspaceFactory, persist
from tests.processes import logged_api_process, wait_for, worker_starter
from tests.stubs.sentry_ingest import SentryIngestStub

__all__ = ["stripe_stub", "stripe_stub_server"]

pytestmark = pytest.mark.slow

REQUEST_ID = "req-correlation-7"


async def test_the_deliverys_request_id_is_on_every_line_of_its_processing_and_on_its_sentry_event(
    settings_env: dict[str, str],
    stripe_stub: StripeStub,
    sentry_stub: SentryIngestStub,
    resources: Resources,
    webhook_secrets: dict[str, str],
    tmp_path: Path,
) -> None:
    env = {
        **settings_env,
        "STRIPE_API_BASE": stripe_stub.base_url,
        "SENTRY_DSN": sentry_stub.dsn,
        "LOG_FORMAT": "json",
        "WEBHOOK_RETRY_BASE_SECONDS": "0.05",
    }
    await persist(resources.db, WorkspaceFactory.build(stripe_customer_id="cus_corr"))
    stripe_stub.put_customer("cus_corr")
    stripe_stub.put_subscription("cus_corr", id="sub_corr", quantity=3)
    stripe_stub.fail("/v1/customers", status=500, times=1)  # the first attempt fails, the retry succeeds
    delivery = signed_stripe_delivery(
        stripe_event("customer.subscription.updated", stripe_subscription("cus_corr", id="sub_corr")),
        webhook_secrets["stripe"],
    )

    async with worker_starter(env, "--queues", "webhook-queue,billing-queue") as start:
        worker = await start()
        with logged_api_process(env, tmp_path / "api.log") as base_url:
            async with httpx.AsyncClient(base_url=base_url) as client:
                headers = {**delivery.headers, "X-Request-Id": REQUEST_ID}
                response = await client.post("/webhooks/stripe", content=delivery.body, headers=headers)
            assert response.status_code == 200 and response.headers["x-request-id"] == REQUEST_ID
            (event,) = await Inbox(resources.db).find(delivery.event_id)

            async def processed() -> bool:
                row = await Inbox(resources.db).get(event.id)
                return row is not None and row.processed_at is not None

            await wait_for(processed, 30, "the event to be processed after one failed attempt")
        lines = [line for line in worker.lines() if f"webhook-event:{event.id}" in str(line.get("job_id", ""))]

    assert event.request_id == REQUEST_ID
    api_lines = [json.loads(raw) for raw in (tmp_path / "api.log").read_text().splitlines() if raw.startswith("{")]
    assert any(line.get("request_id") == REQUEST_ID and "/webhooks/stripe" in line["event"] for line in api_lines)
    assert len(lines) >= 4  # started, failed; started, finished
    assert {line.get("request_id") for line in lines} == {REQUEST_ID}
    assert any(line["level"] == "error" for line in lines)
    (failure,) = sentry_stub.wait_for(lambda events: len(events) >= 1)
    assert failure["tags"]["request_id"] == REQUEST_ID
