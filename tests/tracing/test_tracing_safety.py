"""What traces must never carry or cost: secrets and bodies stay home; unset, nothing is imported or sent; a
stopped worker loses no span of a job it finished."""

from __future__ import annotations

import json
import re
import signal
from functools import partial
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import make_url

from app.core.resources import Resources
from app.testing import clerk_event, signed_clerk_delivery
from app.testing.fixtures import stripe_stub, stripe_stub_server
from app.testing.stripe_stub import StripeStub
from app.webhooks.inbox import Inbox
from app.webhooks.jobs import queue_processing
from tests.processes import logged_api_process, wait_for, worker_starter
from tests.stubs.otlp_receiver import OtlpReceiver
from tests.tracing.conftest import linked_customer, subscription_delivery, tree

__all__ = ["stripe_stub", "stripe_stub_server"]

pytestmark = pytest.mark.slow

DB_PASSWORD = "db-password-never-traced"
STRIPE_API_KEY = "sk_live_stripe_key_never_traced"
CLERK_SECRET_KEY = "sk_live_clerk_key_never_traced"
OPS_PASSWORD = "ops-password-never-traced"
METRICS_TOKEN = "metrics-token-never-traced"
OTLP_API_KEY = "otlp-api-key-never-traced"
PLANTED_BODY = "planted-card-4242-never-traced"  # in the event bodies: payload and SQL parameter values
PLANTED_NAME = "Plantedname-never-traced"
PLANTED_QUERY = "planted-query-never-traced"
PLANTED_RESPONSE = "planted-response-never-traced"  # in what the Stripe stub answers


async def test_no_exported_span_carries_a_secret_a_body_a_payload_value_or_a_query_string(
    traced_env: dict[str, str],
    otlp: OtlpReceiver,
    stripe_stub: StripeStub,
    resources: Resources,
    webhook_secrets: dict[str, str],
    tmp_path: Path,
) -> None:
    database_url = make_url(traced_env["DATABASE_URL"]).set(password=DB_PASSWORD)  # trust auth ignores it
    env = {
        **traced_env,
        "DATABASE_URL": database_url.render_as_string(hide_password=False),
        "STRIPE_API_KEY": STRIPE_API_KEY,
        "STRIPE_API_BASE": stripe_stub.base_url,
        "CLERK_SECRET_KEY": CLERK_SECRET_KEY,
        "OPS_PASSWORD": OPS_PASSWORD,
        "METRICS_TOKEN": METRICS_TOKEN,
        "OTEL_EXPORTER_OTLP_HEADERS": f"x-api-key={OTLP_API_KEY}",
    }
    # No subscription at Stripe: the sync lists them, a call with a query string.
    await linked_customer(resources, stripe_stub, "cus_safe", email=f"{PLANTED_RESPONSE}@example.com")
    stripe = subscription_delivery(
        webhook_secrets["stripe"], "cus_safe", id="sub_safe", metadata={"note": PLANTED_BODY}
    )
    clerk = signed_clerk_delivery(
        clerk_event("user.created", first_name=PLANTED_NAME, last_name=PLANTED_BODY), webhook_secrets["clerk"]
    )

    queues = "webhook-stripe-queue,stripe-sync-queue,identity-queue,webhook-clerk-queue"
    async with worker_starter(env, "--queues", queues) as start:
        await start()
        with logged_api_process(env, tmp_path / "api.log") as base_url:
            async with httpx.AsyncClient(base_url=base_url) as client:
                for path, delivery in (("/webhooks/stripe", stripe), (f"/webhooks/clerk?t={PLANTED_QUERY}", clerk)):
                    response = await client.post(path, content=delivery.body, headers=delivery.headers)
                    assert response.status_code == 200
                login = await client.post("/ops/login", data={"password": OPS_PASSWORD})
                assert login.status_code in (200, 303, 403)
                metrics = await client.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
                assert metrics.status_code == 200
            for event_id in (stripe.event_id, clerk.event_id):
                await wait_for(partial(_processed, resources, event_id), 60, f"event {event_id} processed")
            otlp.wait_for(
                lambda spans: any(s.attributes.get("url.full", "").endswith("/v1/subscriptions") for s in spans),
                what="the Stripe list call's span",
            )
            otlp.wait_for(lambda spans: any(s.name == "ProcessClerkEventJob" for s in spans), what="the Clerk job")

    sent = otlp.sent_bytes()
    planted = [STRIPE_API_KEY, CLERK_SECRET_KEY, OPS_PASSWORD, METRICS_TOKEN, OTLP_API_KEY, DB_PASSWORD]
    planted += [webhook_secrets["stripe"], webhook_secrets["clerk"], PLANTED_BODY, PLANTED_NAME]
    planted += [PLANTED_QUERY, PLANTED_RESPONSE]
    assert [value for value in planted if value.encode() in sent] == []
    services = {span.service for span in otlp.spans}
    assert services == {"saas-jobs-api", "saas-jobs-worker"}, tree(otlp.spans)
    urls = [str(value) for span in otlp.spans for key, value in span.attributes.items() if key.startswith("url.")]
    assert urls and not any("?" in url or "=" in url for url in urls)
    assert "status=all" not in sent.decode(errors="replace")  # the list call's own query string
    assert any(span.name == "POST /webhooks/clerk" for span in otlp.spans)  # its query string dropped, not its span


async def _processed(resources: Resources, event_id: str) -> bool:
    found = await Inbox(resources.db).find(event_id)
    return bool(found) and found[0].processed_at is not None


IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(?P<module>\S+)", re.MULTILINE)


async def test_with_no_endpoint_nothing_is_exported_and_no_process_imports_opentelemetry(
    settings_env: dict[str, str],
    otlp: OtlpReceiver,
    resources: Resources,
    webhook_secrets: dict[str, str],
    tmp_path: Path,
) -> None:
    """Every other variable of OpenTelemetry's is set (a half-done configuration), and Python lists each module
    each process imports (PYTHONPROFILEIMPORTTIME) while it serves a delivery and stops."""
    env = {
        **settings_env,
        "LOG_FORMAT": "json",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{otlp.endpoint}/v1/traces",
        "OTEL_SERVICE_NAME": "should-stay-silent",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "PYTHONPROFILEIMPORTTIME": "1",
    }
    delivery = signed_clerk_delivery(clerk_event("user.created"), webhook_secrets["clerk"])
    api_log = tmp_path / "api.log"
    async with worker_starter(env, "--queues", "webhook-clerk-queue") as start:
        worker = await start()
        with logged_api_process(env, api_log) as base_url:
            async with httpx.AsyncClient(base_url=base_url) as client:
                response = await client.post("/webhooks/clerk", content=delivery.body, headers=delivery.headers)
                assert response.status_code == 200
            await wait_for(lambda: _processed(resources, delivery.event_id), 60, "the event to be processed")
        worker.signal(signal.SIGTERM)
        assert await worker.wait_exit() == 0
        worker_log = worker.text()

    # The listing is there (a worker imports no Litestar: tests/queue/test_worker_imports.py).
    for log, listed in ((api_log.read_text(errors="replace"), {"litestar"}), (worker_log, set())):
        imported = IMPORTED.findall(log)
        assert {*listed, "app.runtime", "app.core.tracing"} <= set(imported)
        # The OpenTelemetry packages, and the modules of Litestar's plugin (which import them): none. The plugin
        # package itself appears once, as the import Litestar tries and we answer "not installed" to.
        assert [module for module in imported if module.partition(".")[0] == "opentelemetry"] == []
        assert [module for module in imported if module.startswith("litestar.plugins.opentelemetry.")] == []
    assert otlp.bodies == []


async def test_a_sigtermed_worker_exports_the_spans_of_the_jobs_it_finished(
    traced_env: dict[str, str], otlp: OtlpReceiver, resources: Resources, webhook_secrets: dict[str, str]
) -> None:
    """The batch processor would wait ten minutes: only the worker's shutdown sends the attempt's span."""
    env = {**traced_env, "OTEL_BSP_SCHEDULE_DELAY": "600000"}
    stored = await Inbox(resources.db).store("clerk", "msg_flushed_on_stop", "user.created", _clerk_payload())
    async with worker_starter(env, "--queues", "webhook-clerk-queue") as start:
        worker = await start()
        await queue_processing(resources.queue, "clerk", stored.row_id)
        await wait_for(lambda: _processed(resources, "msg_flushed_on_stop"), 60, "the event to be processed")
        assert otlp.bodies == []
        worker.signal(signal.SIGTERM)
        assert await worker.wait_exit() == 0

    (attempt,) = [span for span in otlp.spans if span.name == "ProcessClerkEventJob"]
    assert attempt["webhook.inbox_id"] == stored.row_id and attempt.service == "saas-jobs-worker"


def _clerk_payload() -> str:
    return json.dumps(clerk_event("user.created"))
