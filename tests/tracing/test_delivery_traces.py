"""One delivery, one trace: the API's server span, its inbox insert and enqueue, and the worker's attempts with
their SQL and Stripe calls, exported by real processes to an OTLP receiver on loopback."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from app.core.resources import Resources
from app.core.settings import load_settings
from app.runtime import open_resources
from app.testing import clerk_event, signed_clerk_delivery
from app.testing.deliveries import Delivery
from app.testing.fixtures import stripe_stub, stripe_stub_server
from app.testing.stripe_stub import StripeStub
from app.webhooks.inbox import EventRecord, Inbox
from app.webhooks.maintenance import recover
from tests.ops.conftest import OPS_PASSWORD, ops_client
from tests.processes import logged_api_process, wait_for, worker_starter
from tests.stubs.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.stubs.sentry_ingest import SentryIngestStub
from tests.tracing.conftest import linked_customer, subscription_delivery, tree

__all__ = ["stripe_stub", "stripe_stub_server"]

pytestmark = pytest.mark.slow

STRIPE_QUEUES = "webhook-stripe-queue,stripe-sync-queue,identity-queue"


async def _deliver(base_url: str, path: str, delivery: Delivery) -> None:
    async with httpx.AsyncClient(base_url=base_url) as client:
        response = await client.post(path, content=delivery.body, headers=delivery.headers)
    assert response.status_code == 200, response.text


async def _processed(resources: Resources, delivery: Delivery) -> EventRecord:
    async def done() -> EventRecord | None:
        found = await Inbox(resources.db).find(delivery.event_id)
        return found[0] if found and found[0].processed_at is not None else None

    event: EventRecord = await wait_for(done, 60, f"event {delivery.event_id} to be processed")
    return event


def _server_span(otlp: OtlpReceiver, path: str) -> ReceivedSpan:
    spans: list[ReceivedSpan] = otlp.wait_for(
        lambda spans: [s for s in spans if s.kind == "server" and s.name == f"POST {path}"]
    )
    return spans[0]


def _children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> list[ReceivedSpan]:
    return [span for span in spans if span.parent_span_id == parent.span_id]


def _sql(spans: list[ReceivedSpan]) -> list[str]:
    return [
        str(span.attributes.get("db.statement", ""))
        for span in spans
        if span.attributes.get("db.system") == "postgresql"
    ]


async def test_a_clerk_delivery_is_one_trace_from_its_request_through_its_job_and_its_sql(
    traced_env: dict[str, str],
    otlp: OtlpReceiver,
    resources: Resources,
    webhook_secrets: dict[str, str],
    tmp_path: Path,
) -> None:
    delivery = signed_clerk_delivery(clerk_event("user.created"), webhook_secrets["clerk"])
    async with worker_starter(traced_env, "--queues", "webhook-clerk-queue") as start:
        worker = await start()
        with logged_api_process(traced_env, tmp_path / "api.log") as base_url:
            await _deliver(base_url, "/webhooks/clerk", delivery)
            event = await _processed(resources, delivery)
            server = _server_span(otlp, "/webhooks/clerk")
            otlp.wait_for(lambda _: any(s.kind == "consumer" for s in otlp.trace(server.trace_id)), what="the job")
        job_lines = [line for line in worker.lines() if line.get("job_name") == "ProcessClerkEventJob"]

    spans = otlp.trace(server.trace_id)
    drawn = tree(spans)
    assert server.service == "saas-jobs-api" and server["http.response.status_code"] == 200, drawn
    assert server["http.request.method"] == "POST" and server["url.path"] == "/webhooks/clerk"
    in_request = _children(spans, server)
    assert any("INSERT INTO webhook_event" in statement for statement in _sql(in_request)), drawn
    (enqueue,) = [span for span in in_request if span.kind == "producer"]
    assert enqueue.name == "enqueue ProcessClerkEventJob"
    (attempt,) = [span for span in spans if span.kind == "consumer"]
    assert attempt.parent_span_id == enqueue.span_id and attempt.service == "saas-jobs-worker", drawn
    assert attempt.name == "ProcessClerkEventJob" and attempt["messaging.destination.name"] == "webhook-clerk-queue"
    assert attempt["messaging.system"] == "arq" and attempt["job.attempt"] == 1
    assert attempt["webhook.provider"] == "clerk" and attempt["webhook.inbox_id"] == event.id
    assert attempt["webhook.tenant"] == event.tenant_key
    assert any("INSERT INTO app_user" in statement for statement in _sql(_children(spans, attempt))), drawn
    assert event.trace_id == server.trace_id  # kept with the row: the operations page shows it
    assert job_lines and {line.get("trace_id") for line in job_lines} == {server.trace_id}
    assert {line.get("span_id") for line in job_lines} == {attempt.span_id}
    (resource,) = {tuple(sorted(each.items())) for each in otlp.resources if each["service.name"] == "saas-jobs-api"}
    assert dict(resource)["deployment.environment"] == "test"


async def test_a_stripe_delivery_is_one_trace_down_to_its_stripe_call_and_its_sync_links_what_it_covers(
    traced_env: dict[str, str],
    otlp: OtlpReceiver,
    stripe_stub: StripeStub,
    resources: Resources,
    webhook_secrets: dict[str, str],
    tmp_path: Path,
) -> None:
    """Two deliveries about one customer, queued before a worker runs: one sync, in the first one's trace or the
    second's, covers both, and is linked to the trace of each it covers in another."""
    env = {**traced_env, "STRIPE_API_BASE": stripe_stub.base_url}
    await linked_customer(resources, stripe_stub, "cus_traced")
    stripe_stub.put_subscription("cus_traced", id="sub_traced", quantity=3)
    deliveries = [subscription_delivery(webhook_secrets["stripe"], "cus_traced", id="sub_traced") for _ in range(2)]
    with logged_api_process(env, tmp_path / "api.log") as base_url:
        for delivery in deliveries:
            await _deliver(base_url, "/webhooks/stripe", delivery)
        async with worker_starter(env, "--queues", STRIPE_QUEUES) as start:
            await start()
            for delivery in deliveries:
                await _processed(resources, delivery)
            syncs = otlp.wait_for(lambda spans: [s for s in spans if s.name == "StripeSyncJob"], what="the sync")

    servers = [span for span in otlp.spans if span.name == "POST /webhooks/stripe"]
    assert len(servers) == 2
    first = otlp.trace(servers[0].trace_id)
    drawn = tree(first)
    (attempt,) = [span for span in first if span.name == "ProcessStripeEventJob"]
    assert attempt["messaging.destination.name"] == "webhook-stripe-queue", drawn
    for server in servers:  # each event's sync is in its trace, or links it
        assert any(sync.trace_id == server.trace_id or server.trace_id in sync.links for sync in syncs), drawn
    (sync,) = syncs
    assert sync["billing.sync_subject"] == "customer:cus_traced"
    stripe_calls = [
        span for span in otlp.trace(sync.trace_id) if span.kind == "client" and "url.full" in span.attributes
    ]
    (call,) = [span for span in stripe_calls if span["url.full"].endswith("/v1/customers/cus_traced")]
    assert call["http.request.method"] == "GET" and call["http.response.status_code"] == 200
    assert "?" not in call["url.full"]  # the SDK sends expand[]=subscriptions in the query string
    waits = [span for span in otlp.trace(sync.trace_id) if span.name == "wait for stripe budget"]
    assert [wait.span_id for wait in waits] != [] and call.parent_span_id == sync.span_id, tree(
        otlp.trace(sync.trace_id)
    )


async def test_a_retried_attempt_stays_in_the_deliverys_trace_and_its_sentry_event_names_it(
    traced_env: dict[str, str],
    otlp: OtlpReceiver,
    stripe_stub: StripeStub,
    sentry_stub: SentryIngestStub,
    resources: Resources,
    webhook_secrets: dict[str, str],
    tmp_path: Path,
) -> None:
    env = {
        **traced_env,
        "STRIPE_API_BASE": stripe_stub.base_url,
        "SENTRY_DSN": sentry_stub.dsn,
        "WEBHOOK_RETRY_BASE_SECONDS": "0.05",
    }
    await linked_customer(resources, stripe_stub, "cus_retried")
    stripe_stub.put_subscription("cus_retried", id="sub_retried", quantity=2)
    stripe_stub.fail("/v1/customers", status=500, times=1)  # the first read fails, the retry succeeds
    delivery = subscription_delivery(webhook_secrets["stripe"], "cus_retried", id="sub_retried")
    async with worker_starter(env, "--queues", STRIPE_QUEUES) as start:
        await start()
        with logged_api_process(env, tmp_path / "api.log") as base_url:
            await _deliver(base_url, "/webhooks/stripe", delivery)
            await _processed(resources, delivery)
            server = _server_span(otlp, "/webhooks/stripe")

            def two_tries(_: list[ReceivedSpan]) -> list[ReceivedSpan]:
                found = [span for span in otlp.trace(server.trace_id) if span.name == "StripeSyncJob"]
                return found if len(found) == 2 else []

            tries = otlp.wait_for(two_tries, what="the sync's two tries in the delivery's trace")

    assert sorted(span["job.attempt"] for span in tries) == [1, 2], tree(otlp.trace(server.trace_id))
    assert len({span.parent_span_id for span in tries}) == 1  # both follow the one enqueue
    statuses = sorted(
        span["http.response.status_code"] for span in otlp.trace(server.trace_id) if "url.full" in span.attributes
    )
    assert statuses == [200, 500]
    (failure,) = sentry_stub.wait_for(lambda events: len(events) >= 1)
    assert failure["tags"]["trace_id"] == server.trace_id


async def test_a_job_queued_from_a_developers_route_continues_the_requests_trace(
    traced_env: dict[str, str], otlp: OtlpReceiver, tmp_path: Path
) -> None:
    """The route and the job (tests/tracing/saas_example.py) are written as docs/jobs.md shows, with nothing
    about traces."""
    module = "tests.tracing.saas_example:MODULE"
    async with worker_starter(traced_env, "--module", module, "--queues", "default-queue") as start:
        worker = await start()
        factory = "tests.tracing.saas_example:create_app"
        with logged_api_process(traced_env, tmp_path / "api.log", factory=factory) as base_url:
            async with httpx.AsyncClient(base_url=base_url) as client:
                assert (await client.post("/invoices/42/remind")).status_code == 202
            await worker.wait_log("Reminded about invoice 42.")
            server = _server_span(otlp, "/invoices/42/remind")
            (attempt,) = otlp.wait_for(
                lambda _: [s for s in otlp.trace(server.trace_id) if s.name == "SendInvoiceReminderJob"],
                what="the job's attempt in the request's trace",
            )
        (line,) = [line for line in worker.lines() if line["event"] == "Reminded about invoice 42."]

    assert attempt.kind == "consumer" and attempt["messaging.destination.name"] == "default-queue"
    assert line["trace_id"] == server.trace_id and line["span_id"] == attempt.span_id


async def test_an_operators_retry_and_the_recovery_cron_continue_the_deliverys_trace_which_its_page_shows(
    traced_env: dict[str, str],
    otlp: OtlpReceiver,
    stripe_stub: StripeStub,
    resources: Resources,
    webhook_secrets: dict[str, str],
    tmp_path: Path,
) -> None:
    """Stripe is down: each round is one failed try of the customer's sync (WEBHOOK_RETRY_LIMIT=0). The one the
    delivery's job asked for, the one the operations page's Retry asked for (a request of its own, linked), and
    the one asked for by the job the recovery cron queued (a process with no trace of its own) all run in the
    delivery's trace."""
    env = {
        **traced_env,
        "STRIPE_API_BASE": stripe_stub.base_url,
        "OPS_PASSWORD": OPS_PASSWORD,
        "WEBHOOK_RETRY_LIMIT": "0",
    }
    await linked_customer(resources, stripe_stub, "cus_down")
    stripe_stub.fail("/v1/customers", status=500, times=None)
    delivery = subscription_delivery(webhook_secrets["stripe"], "cus_down", id="sub_down")

    def syncs(trace_id: str, count: int) -> list[ReceivedSpan]:
        return otlp.wait_for(
            lambda _: (found := [s for s in otlp.trace(trace_id) if s.name == "StripeSyncJob"])[count - 1 :] and found,
            what=f"{count} tries of the sync in the delivery's trace",
        )

    async with worker_starter(env, "--queues", STRIPE_QUEUES) as start:
        await start()
        with logged_api_process(env, tmp_path / "api.log") as base_url:
            async with ops_client(base_url) as ops:
                await _deliver(base_url, "/webhooks/stripe", delivery)
                server = _server_span(otlp, "/webhooks/stripe")
                syncs(server.trace_id, 1)
                (event,) = await Inbox(resources.db).find(delivery.event_id)
                page = f"/ops/events/{event.id}"
                assert (await ops.post(f"{page}/retry", page=page)).status_code in (200, 303)
                syncs(server.trace_id, 2)
                shown = (await ops.client.get(page)).text
        cron = open_resources(load_settings(env), ())  # as a worker's cron tick would
        try:
            assert (await recover(cron, now=datetime.now(UTC) + timedelta(hours=1))).requeued == 1
        finally:
            await cron.close()
        syncs(server.trace_id, 3)

    spans = otlp.trace(server.trace_id)
    drawn = tree(spans)
    (retry,) = [span for span in spans if span.name == "retry webhook event"]
    (ops_request,) = [span for span in otlp.spans if span.name == f"POST {page}/retry"]
    assert retry.links == [ops_request.trace_id] and retry.service == "saas-jobs-api", drawn
    assert len([span for span in spans if span.name == "ProcessStripeEventJob"]) == 2, drawn  # delivery's, cron's
    assert f'<dd id="trace-id" class="id whole">{server.trace_id}</dd>' in shown
