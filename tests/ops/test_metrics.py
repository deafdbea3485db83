"""``/metrics`` of the API and of each worker, read as Prometheus reads them, after known traffic."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import psutil
import pytest
import stripe
from litestar.testing import AsyncTestClient
from prometheus_client.parser import text_string_to_metric_families

from app.asgi import build_app
from app.core.resources import Resources
from app.core.settings import load_settings
from app.testing import clerk_event, signed_clerk_delivery, signed_stripe_delivery, stripe_event
from app.testing.processes import free_port
from app.webhooks.inbox import Inbox
from app.webhooks.jobs import queue_processing
from app.worker.metrics_server import metrics_answer
from tests.ops.conftest import seed_known_events
from tests.processes import api_process, wait_for, worker_starter
from tests.webhooks.worker_handlers import PROVIDER

pytestmark = pytest.mark.slow

OUTCOMES = (
    "stored",
    "duplicate",
    "ignored",
    "rejected_signature",
    "rejected_payload",
    "too_large",
    "rate_limited",
    "unavailable",
)
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """Every sample of an exposition, keyed by name and sorted labels."""
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(found: Samples, name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def scrape(url: str, token: str | None = None) -> Samples:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(url, headers=headers, timeout=5)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return samples(response.text)


def stripe_signed(body: bytes, secret: str) -> dict[str, str]:
    header = stripe.WebhookSignature.generate_signature_header(body.decode(), secret, timestamp=int(time.time()))
    return {"Content-Type": "application/json", "Stripe-Signature": header}


@pytest.fixture
def apis(settings_env: dict[str, str], tmp_path: Path) -> Iterator[list[str]]:
    """Three API processes sharing one multiprocess directory, as ``uvicorn --workers 3`` runs them; the
    third reaches no database (every delivery it gets is ``unavailable``)."""
    folder = tmp_path / "prometheus"
    folder.mkdir()
    env = {
        **settings_env,
        "PROMETHEUS_MULTIPROC_DIR": str(folder),
        "WEBHOOK_RATE_LIMIT_PER_MINUTE": "12",
        "WEBHOOK_MAX_BODY_BYTES": "4096",
    }
    no_database = {**env, "DATABASE_URL": f"postgresql+asyncpg://postgres@127.0.0.1:{free_port()}/gone"}
    with ExitStack() as stack:
        yield [stack.enter_context(api_process(each)) for each in (env, env, no_database)]


async def test_each_delivery_outcome_is_counted_once_across_api_processes(
    apis: list[str], webhook_secrets: dict[str, str]
) -> None:
    secret = webhook_secrets["stripe"]
    sent: dict[str, int] = {}

    async def post(
        outcome: str, expected_status: int, path: str, body: bytes, headers: dict[str, str], *, api: int | None = None
    ) -> None:
        base_url = apis[sum(sent.values()) % 2 if api is None else api]  # alternately to the first two
        async with httpx.AsyncClient(base_url=base_url) as client:
            response = await client.post(path, content=body, headers=headers)
        assert response.status_code == expected_status, (outcome, response.text)
        sent[outcome] = sent.get(outcome, 0) + 1

    stored = [
        signed_stripe_delivery(stripe_event("customer.subscription.updated", {"id": f"sub_{n}"}), secret)
        for n in range(6)
    ]
    for delivery in stored:
        await post("stored", 200, "/webhooks/stripe", delivery.body, delivery.headers)
    for delivery in stored[:2]:
        await post("duplicate", 200, "/webhooks/stripe", delivery.body, delivery.headers)
    for n in range(2):
        ignored = signed_stripe_delivery(stripe_event("payout.paid", {"id": f"po_{n}"}), secret)
        await post("ignored", 200, "/webhooks/stripe", ignored.body, ignored.headers)
    for n in range(2):  # 12 signed deliveries: the limit
        lost = signed_stripe_delivery(stripe_event("customer.subscription.updated", {"id": f"sub_gone_{n}"}), secret)
        await post("unavailable", 503, "/webhooks/stripe", lost.body, lost.headers, api=2)
    wrong = signed_stripe_delivery(stripe_event("invoice.paid", {"id": "in_1"}), "whsec_" + "d3Jvbmctc2VjcmV0LXdyb25n")
    for _ in range(3):
        await post("rejected_signature", 400, "/webhooks/stripe", wrong.body, wrong.headers)
    cut = b'{"id": "evt_x", "type":'
    await post("rejected_payload", 400, "/webhooks/stripe", cut, stripe_signed(cut, secret))
    big = b'{"id": "evt_big", "pad": "' + b"x" * 5000 + b'"}'
    await post("too_large", 413, "/webhooks/stripe", big, stripe_signed(big, secret))
    for n in range(2):
        late = signed_stripe_delivery(stripe_event("customer.subscription.updated", {"id": f"sub_late_{n}"}), secret)
        await post("rate_limited", 429, "/webhooks/stripe", late.body, late.headers)
    clerk = signed_clerk_delivery(clerk_event("user.updated"), "whsec_" + "d3Jvbmctc2VjcmV0LXdyb25n")
    await post("clerk_rejected_signature", 400, "/webhooks/clerk", clerk.body, clerk.headers)

    views = [scrape(base_url + "/metrics") for base_url in apis[:2]]
    for found in views:
        for outcome in OUTCOMES:
            counted = value(found, "webhook_deliveries_total", provider="stripe", outcome=outcome)
            assert counted == sent[outcome], (outcome, counted, sent[outcome])
        assert value(found, "webhook_deliveries_total", provider="clerk", outcome="rejected_signature") == 1
        at_zero = ("webhook_deliveries_total", (("outcome", "stored"), ("provider", "clerk")))
        assert found[at_zero] == 0  # every series exists from the start
        assert value(found, "webhook_inbox_events", provider="stripe", state="pending") == sent["stored"]
    assert deliveries(views[0]) == deliveries(views[1])


def deliveries(found: Samples) -> Samples:
    return {key: count for key, count in found.items() if key[0] == "webhook_deliveries_total"}


async def test_the_api_metrics_need_the_token_when_one_is_set(settings_env: dict[str, str]) -> None:
    app = build_app(load_settings({**settings_env, "METRICS_TOKEN": "scrape-token-5521"}))
    async with AsyncTestClient(app) as client:
        assert (await client.get("/metrics")).status_code == 401
        wrong = await client.get("/metrics", headers={"Authorization": "Bearer not-it"})
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
        assert "METRICS_TOKEN" in wrong.text
        right = await client.get("/metrics", headers={"Authorization": "Bearer scrape-token-5521"})
        assert right.status_code == 200
        assert "scrape-token-5521" not in right.text


async def test_the_pipeline_gauges_equal_the_database_at_scrape_time(
    settings_env: dict[str, str], resources: Resources
) -> None:
    known = await seed_known_events(resources)
    await queue_processing(resources.queue, "stripe", known.failed_row)
    async with AsyncTestClient(build_app(load_settings(settings_env))) as client:
        response = await client.get("/metrics")
    found = samples(response.text)

    for provider, counts in known.counts.items():
        for state in ("pending", "failed", "set_aside"):
            assert value(found, "webhook_inbox_events", provider=provider, state=state) == counts[state]
    assert value(found, "queue_jobs_waiting", queue="webhook-stripe-queue") == 1
    assert value(found, "workers_alive") == 0
    assert value(found, "cron_period_seconds", cron="WebhookRecoveryCronJob") == 600
    assert value(found, "cron_period_seconds", cron="WebhookRetentionCronJob") == 86400
    assert not [key for key in found if key[0] == "cron_last_success_timestamp_seconds"]  # no tick has run yet


async def test_an_empty_inbox_shows_every_state_of_each_enabled_provider_at_0(settings_env: dict[str, str]) -> None:
    """Alert rules and dashboards see 0, not an absent series, before the first event (or after the last one)."""
    without_clerk = {key: value for key, value in settings_env.items() if key != "CLERK_WEBHOOK_SIGNING_SECRET"}
    for env, providers in ((settings_env, {"stripe", "clerk"}), (without_clerk, {"stripe"})):
        async with AsyncTestClient(build_app(load_settings(env))) as client:
            found = samples((await client.get("/metrics")).text)
        inbox = {key: count for key, count in found.items() if key[0] == "webhook_inbox_events"}
        expected = {
            ("webhook_inbox_events", (("provider", provider), ("state", state))): 0.0
            for provider in providers
            for state in ("pending", "failed", "set_aside")
        }
        assert inbox == expected


async def test_each_worker_serves_its_own_metrics_behind_the_token(
    settings_env: dict[str, str], effects_table: Resources
) -> None:
    resources = effects_table
    port = free_port()
    env = {**settings_env, "METRICS_TOKEN": "scrape-token-5521"}
    module = "tests.webhooks.worker_handlers:MODULE"
    async with worker_starter(env, "--module", module, "--queues", "webhook-queue") as start:
        await start(WORKER_METRICS_PORT=str(port))
        stored = await Inbox(resources.db).store(PROVIDER, "evt_metrics_1", "test.event", "{}")
        await queue_processing(resources.queue, PROVIDER, stored.row_id)
        url = f"http://127.0.0.1:{port}/metrics"

        def processed_once() -> bool:
            try:
                found = scrape(url, "scrape-token-5521")
            except httpx.ConnectError:  # on a busy machine the first scrape can come before the worker listens
                return False
            return value(found, "webhook_events_processed_total", provider=PROVIDER) == 1

        await wait_for(processed_once, 30, "the worker to count the processed event")
        found = scrape(url, "scrape-token-5521")
        assert value(found, "job_runs_total", job="ProcessWebhookEventJob", outcome="ok") == 1
        born_at_zero = [
            ("job_runs_total", (("job", "ProcessWebhookEventJob"), ("outcome", "failed"))),
            ("webhook_events_set_aside_total", (("provider", PROVIDER),)),
        ]
        assert [found.get(key) for key in born_at_zero] == [0, 0]
        assert value(found, "job_duration_seconds_count", job="ProcessWebhookEventJob") == 1
        assert value(found, "webhook_pipeline_seconds_count", provider=PROVIDER) == 1
        async with httpx.AsyncClient() as client:
            assert (await client.get(url)).status_code == 401
        async with AsyncTestClient(build_app(load_settings(env))) as client:
            api = samples((await client.get("/metrics", headers={"Authorization": "Bearer scrape-token-5521"})).text)
        assert value(api, "workers_alive") == 1


async def test_a_taken_metrics_port_is_one_warning_and_the_worker_runs_on(settings_env: dict[str, str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        async with worker_starter(settings_env, "--queues", "webhook-queue") as start:
            worker = await start(WORKER_METRICS_PORT=str(port))
            await worker.wait_log("Worker metrics")  # logged just after "Worker serving", as the server starts
            assert worker.process.poll() is None
            warnings = [line for line in worker.lines() if "Worker metrics" in str(line.get("event"))]
    assert len(warnings) == 1 and warnings[0]["level"] == "warning"
    assert f"port {port} is not free" in warnings[0]["event"]


def listening_ports(pid: int) -> set[int]:
    process = psutil.Process(pid)
    sockets = [conn for each in (process, *process.children(recursive=True)) for conn in each.net_connections("inet")]
    return {conn.laddr.port for conn in sockets if conn.status == psutil.CONN_LISTEN}


async def test_worker_metrics_port_0_serves_no_port(settings_env: dict[str, str]) -> None:
    port = free_port()
    async with worker_starter(settings_env, "--queues", "webhook-queue") as start:
        serving = await start(WORKER_METRICS_PORT=str(port))
        off = await start(WORKER_METRICS_PORT="0")
        await wait_for(lambda: port in listening_ports(serving.process.pid), 10, "the first worker's metrics port")

        assert listening_ports(off.process.pid) == set()
        assert not [line for line in off.lines() if "Worker metrics" in str(line.get("event"))]
        assert any(
            f"Worker metrics on http://127.0.0.1:{port}/metrics" in str(line.get("event")) for line in serving.lines()
        )


def test_the_worker_metrics_answer_get_metrics_only_and_check_the_token() -> None:
    def status(request: str, token: str | None) -> str:
        return metrics_answer(request.encode(), token).split(b"\r\n", 1)[0].decode()

    ok = "GET /metrics HTTP/1.1\r\nHost: w\r\nAuthorization: Bearer t0k3n-9\r\n\r\n"
    assert status(ok, "t0k3n-9") == "HTTP/1.1 200 OK"
    assert status(ok.replace("t0k3n-9", "other"), "t0k3n-9") == "HTTP/1.1 401 Unauthorized"
    assert status("GET /metrics HTTP/1.1\r\nHost: w\r\n\r\n", "t0k3n-9") == "HTTP/1.1 401 Unauthorized"
    assert status("GET /metrics?x=1 HTTP/1.1\r\n\r\n", None) == "HTTP/1.1 200 OK"
    assert status("GET /other HTTP/1.1\r\n\r\n", None) == "HTTP/1.1 404 Not Found"
    assert status("POST /metrics HTTP/1.1\r\n\r\n", None) == "HTTP/1.1 404 Not Found"
    answer = metrics_answer(ok.encode(), "t0k3n-9")
    head, body = answer.split(b"\r\n\r\n", 1)
    assert f"Content-Length: {len(body)}".encode() in head and b"Connection: close" in head
    assert b"# TYPE job_runs_total counter" in body
