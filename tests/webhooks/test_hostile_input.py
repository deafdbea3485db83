"""Hostile input at intake (docs/behaviour.md, its rows for hostile input): a clear 4xx, nothing stored, never a 5xx."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from stripe import WebhookSignature
from svix.webhooks import Webhook

from app.asgi import build_app
from app.core.resources import Resources
from app.core.sentry import flush_sentry
from app.core.settings import load_settings
from app.runtime import WORKER_MODULES, open_resources
from app.testing.deliveries import (
    Delivery,
    clerk_event,
    signed_clerk_delivery,
    signed_stripe_delivery,
    stripe_event,
    stripe_subscription,
)
from app.webhooks import guards
from app.webhooks.processing import process_event
from app.webhooks.verification import MAX_SIGNATURE_HEADER_BYTES
from tests.stubs.sentry_ingest import SentryIngestStub
from tests.webhooks.conftest import inbox_count, inbox_rows


def stripe_headers(body: bytes, secret: str, *, timestamp: int | None = None) -> dict[str, str]:
    header = WebhookSignature.generate_signature_header(body.decode(), secret, timestamp=timestamp or int(time.time()))
    return {"Content-Type": "application/json", "Stripe-Signature": header}


def clerk_headers(body: bytes, secret: str, msg_id: str = "msg_hostile") -> dict[str, str]:
    from datetime import UTC, datetime

    when = datetime.now(UTC)
    return {
        "svix-id": msg_id,
        "svix-timestamp": str(int(when.timestamp())),
        "svix-signature": Webhook(secret).sign(msg_id, when, body.decode()),
    }


def nested(depth: int) -> bytes:
    """A Stripe event whose ``data`` holds arrays nested so the whole body is ``depth`` levels deep."""
    inner = b"[" * (depth - 2) + b"]" * (depth - 2)
    return b'{"id":"evt_deep","type":"customer.subscription.updated","data":{"object":' + inner + b"}}"


async def test_unsigned_garbled_and_non_ascii_signature_headers_get_400(
    client: Any, resources: Resources, webhook_secrets: dict[str, str]
) -> None:
    body = b'{"id": "evt_1", "type": "customer.subscription.updated"}'
    now = int(time.time())
    headers_tried: list[dict[str, Any]] = [
        {"Stripe-Signature": f"t={now},v1=".encode() + "é".encode("latin-1") * 64},  # TypeError in hmac before
        {"Stripe-Signature": "garbage"},
        {"Stripe-Signature": f"t=soon,v1={'0' * 64}"},
        {"Stripe-Signature": f"t={now}"},
        {"Stripe-Signature": f"t={now},t={now},v1={'0' * 64}"},
        {"Stripe-Signature": f"t={now}," + ",".join(f"v1={'0' * 64}" for _ in range(200))},  # over 8 KB
    ]
    for headers in headers_tried:
        response = await client.post("/webhooks/stripe", content=body, headers={**headers, "Content-Type": "x"})
        assert response.status_code == 400, (headers, response.text)
        assert response.json()["detail"]
    assert await inbox_count(resources) == 0


def padded(header: str, length: int, entry: str, sep: str, *, before: bool = False) -> str:
    """``header`` with harmless ``entry`` items (the provider skips them) making it exactly ``length`` long."""
    pads: list[str] = []
    room = length - len(header)
    while room > 0:
        size = min(room, len(sep) + len(entry) + 64)
        if room - size <= len(sep) + len(entry):  # no remainder too short for an entry of its own
            size = room
        pads.append(entry + "0" * (size - len(sep) - len(entry)))
        room -= size
    result = sep.join([*pads, header] if before else [header, *pads])
    assert len(result) == length
    return result


@pytest.mark.parametrize("length", [MAX_SIGNATURE_HEADER_BYTES, MAX_SIGNATURE_HEADER_BYTES + 1])
async def test_a_valid_signature_header_is_accepted_up_to_8_kb_and_refused_past_it(
    client: Any, resources: Resources, webhook_secrets: dict[str, str], length: int
) -> None:
    """The limit holds even for a header whose signature verifies: past it nothing is even checked."""
    accepted = length <= MAX_SIGNATURE_HEADER_BYTES
    stripe_delivery = signed_stripe_delivery(
        stripe_event("customer.subscription.updated", {"id": "sub_1"}, event_id=f"evt_pad_{length}"),
        webhook_secrets["stripe"],
    )
    stripe_headers_padded = {
        **stripe_delivery.headers,
        "Stripe-Signature": padded(stripe_delivery.headers["Stripe-Signature"], length, "v0=", ","),
    }
    clerk_delivery = signed_clerk_delivery(clerk_event("user.updated"), webhook_secrets["clerk"])
    clerk_headers_padded = {
        **clerk_delivery.headers,
        "svix-signature": padded(clerk_delivery.headers["svix-signature"], length, "v0,", " ", before=True),
    }
    for path, delivery, headers, name in (
        ("/webhooks/stripe", stripe_delivery, stripe_headers_padded, "Stripe-Signature"),
        ("/webhooks/clerk", clerk_delivery, clerk_headers_padded, "svix-signature"),
    ):
        response = await client.post(path, content=delivery.body, headers=headers)
        if accepted:
            assert response.status_code == 200, (path, response.text)
        else:
            assert response.status_code == 400, (path, response.text)
            assert response.json()["detail"] == f"{name} header is longer than {MAX_SIGNATURE_HEADER_BYTES} bytes."
    assert await inbox_count(resources) == (2 if accepted else 0)


async def test_a_stripe_timestamp_more_than_300_s_in_the_future_is_refused(
    client: Any, resources: Resources, webhook_secrets: dict[str, str]
) -> None:
    body = b'{"id": "evt_future", "type": "customer.subscription.updated"}'
    future = stripe_headers(body, webhook_secrets["stripe"], timestamp=int(time.time()) + 3600)
    response = await client.post("/webhooks/stripe", content=body, headers=future)
    assert response.status_code == 400
    assert "future" in response.json()["detail"]
    assert await inbox_count(resources) == 0


@pytest.mark.parametrize(
    "field_json",
    [
        b'"id": "evt_' + b"x" * 300 + b'", "type": "customer.subscription.updated"',
        b'"id": "evt_nul\\u0000", "type": "customer.subscription.updated"',
        b'"id": "evt_ok", "type": "customer.subscription.' + b"x" * 300 + b'"',
        b'"id": "evt_ok", "type": "customer.subscription.updated\\u0000"',
        b'"id": 42, "type": "customer.subscription.updated"',
    ],
)
async def test_an_event_id_or_type_that_cannot_be_stored_is_refused_for_good(
    client: Any, resources: Resources, webhook_secrets: dict[str, str], field_json: bytes
) -> None:
    """Over 255 characters or holding NUL: a 400 (do not deliver again), where it was a 503 forever."""
    body = b"{" + field_json + b"}"
    response = await client.post(
        "/webhooks/stripe", content=body, headers=stripe_headers(body, webhook_secrets["stripe"])
    )
    assert response.status_code == 400, response.text
    assert await inbox_count(resources) == 0


def _nul_deliveries(secrets: dict[str, str]) -> dict[str, Delivery]:
    """Signed events holding a NUL in the very id their tenant (and, for Stripe, their sync subject) is read from."""
    membership = clerk_event("organizationMembership.created")
    membership["data"]["organization"] = {**membership["data"]["organization"], "id": "org_nul\x00a"}
    subscription = stripe_subscription("cus_nul\x00a")
    return {
        "clerk user.created data.id": signed_clerk_delivery(
            clerk_event("user.created", id="user_nul\x00a"), secrets["clerk"]
        ),
        "clerk organization.created data.id": signed_clerk_delivery(
            clerk_event("organization.created", id="org_nul\x00b"), secrets["clerk"]
        ),
        "clerk organizationMembership.created data.organization.id": signed_clerk_delivery(
            membership, secrets["clerk"]
        ),
        "stripe customer.subscription.updated data.object.customer": signed_stripe_delivery(
            stripe_event("customer.subscription.updated", subscription), secrets["stripe"]
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "clerk user.created data.id",
        "clerk organization.created data.id",
        "clerk organizationMembership.created data.organization.id",
        "stripe customer.subscription.updated data.object.customer",
    ],
)
async def test_a_nul_in_the_id_an_events_tenant_is_read_from_is_stored_once_with_u_fffd_and_handled(
    settings_env: dict[str, str], webhook_secrets: dict[str, str], caplog: pytest.LogCaptureFixture, case: str
) -> None:
    """It was answered 503 on every delivery (the tenant key still held the NUL), so the provider gave up on it.

    The stored payload and every key read from it hold U+FFFD instead; the API logs no error; a Clerk event is
    then applied like any other (a Stripe one asks for the sync of its subject, as the worker's job does).
    """
    delivery = _nul_deliveries(webhook_secrets)[case]
    settings = load_settings(settings_env)
    worker = open_resources(settings, WORKER_MODULES)
    try:
        async with AsyncTestClient(build_app(settings)) as api:
            with caplog.at_level(logging.WARNING):
                for _ in range(2):
                    response = await api.post(
                        f"/webhooks/{case.split()[0]}", content=delivery.body, headers=delivery.headers
                    )
                    assert response.status_code == 200, response.text
        assert not [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]
        (row,) = await inbox_rows(worker)
        assert "\ufffd" in (row.tenant_key or ""), row.tenant_key
        assert "\x00" not in str(row.payload) and "\ufffd" in str(row.payload)
        if row.provider == "stripe":
            assert row.sync_subject == "customer:cus_nul\ufffda"
            return
        await process_event(worker, row.id, row.provider)
        (row,) = await inbox_rows(worker)
        assert row.processed_at is not None and row.last_error is None
    finally:
        await worker.close()


async def test_a_clerk_svix_id_that_cannot_be_stored_is_refused(
    client: Any, resources: Resources, webhook_secrets: dict[str, str]
) -> None:
    body = b'{"type": "user.created", "data": {"id": "user_1"}}'
    headers = clerk_headers(body, webhook_secrets["clerk"], msg_id="msg_" + "x" * 300)
    response = await client.post("/webhooks/clerk", content=body, headers=headers)
    assert response.status_code == 400
    assert await inbox_count(resources) == 0


@pytest.mark.parametrize(
    "body",
    [
        nested(65),
        nested(10_000),
        b'{"id": "evt_big", "type": "customer.subscription.updated", "n": ' + b"9" * 5000 + b"}",
        b'{"id": "evt_inf", "type": "customer.subscription.updated", "n": 1e400}',
        b'{"id": "evt_surrogate", "type": "customer.subscription.updated", "s": "\\ud800"}',
    ],
    ids=["65-deep", "10000-deep", "5000-digits", "1e400", "lone-surrogate"],
)
async def test_a_signed_body_the_decoder_refuses_gets_400_and_stores_nothing(
    client: Any, resources: Resources, webhook_secrets: dict[str, str], body: bytes
) -> None:
    response = await client.post(
        "/webhooks/stripe", content=body, headers=stripe_headers(body, webhook_secrets["stripe"])
    )
    assert response.status_code == 400, response.text
    assert await inbox_count(resources) == 0


async def test_64_levels_and_numbers_postgres_cannot_hold_are_stored_as_the_worker_reads_them(
    client: Any, resources: Resources, webhook_secrets: dict[str, str]
) -> None:
    deep = nested(64)
    tiny = b'{"id": "evt_tiny", "type": "customer.subscription.updated", "n": 1e-20000}'  # overflows numeric
    for body in (deep, tiny):
        headers = stripe_headers(body, webhook_secrets["stripe"])
        response = await client.post("/webhooks/stripe", content=body, headers=headers)
        assert response.status_code == 200, response.text
    rows = {row.event_id: row for row in await inbox_rows(resources)}
    assert rows["evt_tiny"].payload["n"] == 0.0
    assert set(rows) == {"evt_deep", "evt_tiny"}


@pytest.mark.parametrize(
    "body",
    [b"{" + b" " * (2 * 1024 * 1024) + b"}", b"this is not json", b"{", b"[" * 10_000 + b"]" * 10_000],
    ids=["2-MB", "not-json", "open-brace", "10000-deep"],
)
async def test_a_switched_off_route_answers_404_whatever_the_body_with_sentry_on(
    make_client: Any, sentry_enabled: SentryIngestStub, body: bytes
) -> None:
    """docs/behaviour.md: the switch comes before the size and the body; nothing reads it first (Sentry's Litestar
    integration did: a 413 for 2 MB, a 500 for bad JSON) and nothing reaches Sentry."""
    client = await make_client(
        BILLING_PROVIDER="none",
        CLERK_WEBHOOK_SIGNING_SECRET="",
        WEBHOOK_MAX_BODY_BYTES="1024",
        SENTRY_DSN=sentry_enabled.dsn,
    )
    for path in ("/webhooks/stripe", "/webhooks/clerk"):
        response = await client.post(path, content=body, headers={"Content-Type": "application/json"})
        assert response.status_code == 404, (path, response.text)
    flush_sentry(timeout=5)
    assert sentry_enabled.events == []
    assert sentry_enabled.sent_bytes() == b""


async def asgi_post(client: Any, path: str, receive: Any) -> list[dict[str, Any]]:
    """One POST straight into the client's ASGI app, its body as ``receive`` gives it (a test client sends it
    whole). It runs on the event loop the app started on, as a server runs it: the app's Redis connections
    belong to that loop."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"100")],
        "client": ("192.0.2.1", 4000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }
    await asyncio.to_thread(client.blocking_portal.call, client.app, scope, receive, send)
    return sent


async def test_a_body_not_received_within_the_time_limit_gets_408(
    client: Any, resources: Resources, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunks = [{"type": "http.request", "body": b'{"id": "evt_slow",', "more_body": True}]

    async def trickle() -> dict[str, Any]:
        if chunks:
            return chunks.pop(0)
        await asyncio.sleep(5)  # the rest never comes in time
        return {"type": "http.request", "body": b"}", "more_body": False}

    for guard in _guards(client):
        monkeypatch.setattr(guard, "body_timeout", 0.2)
    sent = await asgi_post(client, "/webhooks/stripe", trickle)
    assert sent[0]["status"] == 408
    assert (b"connection", b"close") in sent[0]["headers"]
    assert await inbox_count(resources) == 0


async def test_a_client_gone_mid_body_is_quiet(client: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Nothing above info in the logs (the access line is info), and nothing for Sentry: it is not our fault."""
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": b'{"id": "evt_', "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    with caplog.at_level(logging.INFO):
        sent = await asgi_post(client, "/webhooks/stripe", receive)
    assert sent[0]["status"] == 400
    assert not [record for record in caplog.records if record.levelno > logging.INFO]


async def test_refused_deliveries_are_logged_at_warning_once_a_minute_with_a_count(
    client: Any, webhook_secrets: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """A secret rotated wrongly shows at once, without a line per request."""
    delivery = signed_stripe_delivery(
        stripe_event("payout.paid", {"id": "po_1"}), "whsec_" + "d3Jvbmctc2VjcmV0LXdyb25n"
    )
    with caplog.at_level(logging.WARNING, logger="app.webhooks.refusals"):
        for _ in range(3):
            response = await client.post("/webhooks/stripe", content=delivery.body, headers=delivery.headers)
            assert response.status_code == 400
    (line,) = [record for record in caplog.records if record.name == "app.webhooks.refusals"]
    assert line.levelno == logging.WARNING
    assert (line.provider, line.reason) == ("stripe", "rejected_signature")  # type: ignore[attr-defined]
    assert "STRIPE_WEBHOOK_SECRET" in line.getMessage()


async def test_the_openapi_document_describes_the_webhook_routes(client: Any) -> None:
    response = await client.get("/schema")
    assert response.status_code == 200
    paths = response.json()["paths"]
    assert {"/webhooks/stripe", "/webhooks/clerk", "/health", "/ready"} <= set(paths)
    stripe = paths["/webhooks/stripe"]["post"]
    assert {p["name"] for p in stripe["parameters"] if p["in"] == "header"} == {"Stripe-Signature"}
    assert set(stripe["responses"]) == {"200", "400", "408", "413", "429", "503"}
    clerk = paths["/webhooks/clerk"]["post"]
    assert {p["name"] for p in clerk["parameters"]} == {"svix-id", "svix-timestamp", "svix-signature"}
    ready = paths["/ready"]["get"]["responses"]
    assert set(ready) == {"200", "503"}
    for answer in ready.values():
        assert answer["description"]
        schema = answer["content"]["application/json"]["schema"]
        if "$ref" in schema:
            schema = response.json()["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
        assert set(schema["properties"]) == {"postgres", "redis"}
    (example,) = ready["503"]["content"]["application/json"]["examples"].values()
    assert example["value"]["redis"].startswith("error: ")


async def test_a_clerk_delivery_with_oversized_or_non_ascii_svix_headers_gets_400(
    client: Any, resources: Resources, webhook_secrets: dict[str, str]
) -> None:
    delivery = signed_clerk_delivery(clerk_event("user.created"), webhook_secrets["clerk"])
    for name, value in (
        ("svix-signature", "v1," + "A" * 9000),
        ("svix-signature", b"v1," + "é".encode("latin-1")),
    ):
        response = await client.post(
            "/webhooks/clerk", content=delivery.body, headers={**delivery.headers, name: value}
        )
        assert response.status_code == 400
    assert await inbox_count(resources) == 0


def _guards(client: Any) -> list[guards.WebhookSignatureGuard]:
    found = []
    for route in client.app.routes:
        for handler in getattr(route, "route_handlers", ()):
            guard = getattr(handler, "before_request", None)
            found += [guard] if isinstance(guard, guards.WebhookSignatureGuard) else []
    return found
