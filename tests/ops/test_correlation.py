"""The request id of the delivery that stored an event, followed into the worker: every line of the event's
processing carries it, and so does the Sentry event of its failed attempt."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core.resources import Resources
from app.core.settings import load_settings
from app.runtime import open_resources
from app.testing import signed_stripe_delivery, stripe_event, stripe_subscription
from app.testing.fixtures import stripe_stub, stripe_stub_server
from app.testing.stripe_stub import StripeStub
from app.webhooks.inbox import Inbox
from app.webhooks.maintenance import recover
from tests.factories import WorkspaceFactory, persist
from tests.ops.conftest import OPS_PASSWORD, ops_client
from tests.processes import WorkerProc, logged_api_process, wait_for, worker_starter
from tests.stubs.sentry_ingest import SentryIngestStub

__all__ = ["stripe_stub", "stripe_stub_server"]

pytestmark = pytest.mark.slow

QUEUES = "webhook-stripe-queue,stripe-sync-queue,identity-queue"
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

    async with worker_starter(env, "--queues", QUEUES) as start:
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
        lines = _job_lines(worker, event.id)

    assert event.request_id == REQUEST_ID
    api_lines = [json.loads(raw) for raw in (tmp_path / "api.log").read_text().splitlines() if raw.startswith("{")]
    assert any(line.get("request_id") == REQUEST_ID and "/webhooks/stripe" in line["event"] for line in api_lines)
    # The event's job (it asks for the customer's sync), then the sync: started, failed; started, finished.
    assert len([line for line in lines if "stripe-sync:" in line["job_id"]]) >= 4
    assert any("webhook-event:" in line["job_id"] for line in lines)
    assert {line.get("request_id") for line in lines} == {REQUEST_ID}
    assert any(line["level"] == "error" for line in lines)
    (failure,) = sentry_stub.wait_for(lambda events: len(events) >= 1)
    assert failure["tags"]["request_id"] == REQUEST_ID


async def test_an_event_queued_again_by_an_operator_or_the_recovery_cron_keeps_its_deliverys_request_id(
    settings_env: dict[str, str],
    stripe_stub: StripeStub,
    sentry_stub: SentryIngestStub,
    resources: Resources,
    webhook_secrets: dict[str, str],
    tmp_path: Path,
) -> None:
    """Each round is one try (WEBHOOK_RETRY_LIMIT=0) of the customer's sync, which fails: the one the delivery's
    job asked for, then the one asked for by the job the operations page's Retry queued (a request with an id of
    its own), then by the one the recovery cron queued (a process with no request at all). Every line of each
    job, its start and its failure included, and each failure's Sentry event carry the delivery's request id."""
    env = {
        **settings_env,
        "STRIPE_API_BASE": stripe_stub.base_url,
        "SENTRY_DSN": sentry_stub.dsn,
        "LOG_FORMAT": "json",
        "OPS_PASSWORD": OPS_PASSWORD,
        "WEBHOOK_RETRY_LIMIT": "0",
    }
    await persist(resources.db, WorkspaceFactory.build(stripe_customer_id="cus_corr"))
    stripe_stub.put_customer("cus_corr")
    stripe_stub.fail("/v1/customers", status=500, times=None)  # Stripe is down: every try fails
    delivery = signed_stripe_delivery(
        stripe_event("customer.subscription.updated", stripe_subscription("cus_corr", id="sub_corr")),
        webhook_secrets["stripe"],
    )

    async with worker_starter(env, "--queues", QUEUES) as start:
        worker = await start()
        with logged_api_process(env, tmp_path / "api.log") as base_url:
            async with ops_client(base_url) as ops:
                headers = {**delivery.headers, "X-Request-Id": REQUEST_ID}
                response = await ops.client.post("/webhooks/stripe", content=delivery.body, headers=headers)
                assert response.status_code == 200
                (event,) = await Inbox(resources.db).find(delivery.event_id)
                await _failed_tries(worker, resources, event.id, 1)

                page = f"/ops/events/{event.id}"
                retried = await ops.post(f"{page}/retry", None, page=page, **{"X-Request-Id": "req-ops-retry-9"})
                assert retried.status_code in (200, 303) and retried.headers["x-request-id"] == "req-ops-retry-9"
                await _failed_tries(worker, resources, event.id, 2)

        cron = open_resources(load_settings(env), ())  # as a worker's cron tick: no request, one try per job
        try:
            report = await recover(cron, now=datetime.now(UTC) + timedelta(hours=1))
        finally:
            await cron.close()
        assert report.requeued == 1
        await _failed_tries(worker, resources, event.id, 3)
        lines = _job_lines(worker, event.id)

    told = [" ".join(line["event"].split()[:3]) for line in lines if line["event"].startswith(("Job ", "Sync of"))]
    event_job = ["Job ProcessStripeEventJob started", "Job ProcessStripeEventJob finished"]
    sync = ["Job StripeSyncJob started", "Sync of customer:cus_corr", "Job StripeSyncJob finished"]
    # The delivery's job asks for the sync; the operator's Retry asks for it at once; the recovery cron's job asks.
    assert told == [*event_job, *sync, *sync, *event_job, *sync]
    assert {line.get("request_id") for line in lines} == {REQUEST_ID}
    failures = sentry_stub.wait_for(lambda events: len(events) >= 3)
    assert [failure["tags"].get("request_id") for failure in failures] == [REQUEST_ID] * 3


def _job_lines(worker: WorkerProc, row_id: int) -> list[dict[str, Any]]:
    """The lines of the event's jobs and of its customer's syncs."""
    mine = (f"webhook-event:{row_id}", "stripe-sync:customer:cus_corr:")
    return [line for line in worker.lines() if any(key in str(line.get("job_id", "")) for key in mine)]


async def _failed_tries(worker: WorkerProc, resources: Resources, row_id: int, count: int) -> None:
    """Until the event's sync failed ``count`` times (each an attempt of the event) and ended its round."""

    async def failed() -> bool:
        lines = _job_lines(worker, row_id)
        ended = sum(line["event"].startswith("Job StripeSyncJob finished") for line in lines) >= count
        row = await Inbox(resources.db).get(row_id)
        return ended and row is not None and row.attempts == count

    await wait_for(failed, 30, f"{count} failed syncs of the event's customer")
