"""Hostile requests, generated from the API's own ``/schema``, against a running API with Sentry on.

The webhook routes are the document's POST operations tagged ``webhooks``
(``tests/webhook_routes.py``), not every POST: the API also serves a SaaS
developer's own POST route (``NOTES``), as a reader of docs/jobs.md adds one.
A request to a webhook route is unsigned, signed with a hostile body, signed
and valid, over ``WEBHOOK_MAX_BODY_BYTES`` (413, whatever else it is), or sent
to a second API whose providers are switched off (404, whatever the body); a
request to another POST route gets a hostile body and path. Every body carries
a planted string. The run asserts: no answer is a 5xx; the inbox holds exactly
the valid signed events; Sentry received no event at all (docs/behaviour.md:
bad input is never one), and no Sentry item and no log line carries a
configured secret or the planted string. A failing example prints short (a
body's first bytes and its size).

A few thousand requests in ``make test``; more with
``make test PYTEST_ARGS="tests/fuzz --fuzz-examples=10000"``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import asyncpg
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import make_url
from stripe import WebhookSignature
from svix.webhooks import Webhook

from tests.processes import logged_api_process
from tests.stubs.sentry_ingest import SentryIngestStub
from tests.webhook_routes import WebhookOperation, other_post_paths, webhook_operations

pytestmark = pytest.mark.slow(15)
PLANTED = "planted-body-0f1e2d3c"
SECRETS = {
    "STRIPE_API_KEY": "sk_live_fuzz_api_key_0001",
    "CLERK_SECRET_KEY": "sk_live_fuzz_clerk_key_0002",
    "OPS_PASSWORD": "fuzz-ops-password-0003",
    "METRICS_TOKEN": "fuzz-metrics-token-0004",
}
DB_PASSWORD = "fuzzDbPassw0rd"
MAX_BODY_BYTES = 65536
API_FACTORY = "tests.webhook_routes:create_app"
"""The API with a SaaS developer's own POST route beside the webhook routes."""


@dataclass
class Run:
    base_url: str
    secrets: dict[str, str]
    routes: dict[str, WebhookOperation]
    """The webhook routes, by path."""
    other_routes: list[str]
    """Every other POST route (path templates): a SaaS developer's own."""
    client: httpx.Client
    switched_off: httpx.Client
    """The API of a second process whose providers are both switched off."""
    expected: set[tuple[str, str]] = field(default_factory=set)
    answers: dict[int, int] = field(default_factory=dict)
    """Statuses of the webhook routes' answers, counted."""
    other_answers: dict[int, int] = field(default_factory=dict)
    """Statuses of the other routes' answers, counted."""
    requests: int = 0


@pytest.fixture(scope="module")
def sentry() -> Iterator[SentryIngestStub]:
    stub = SentryIngestStub().start()
    yield stub
    stub.stop()


@pytest.fixture
def run(
    settings_env: dict[str, str], sentry: SentryIngestStub, tmp_path: Path, webhook_secrets: dict[str, str]
) -> Iterator[Run]:
    database_url = make_url(settings_env["DATABASE_URL"]).set(password=DB_PASSWORD)
    env = {
        **settings_env,
        **SECRETS,
        "DATABASE_URL": database_url.render_as_string(hide_password=False),
        "SENTRY_DSN": sentry.dsn,
        "LOG_FORMAT": "json",
        "WEBHOOK_RATE_LIMIT_PER_MINUTE": "1000000",
        "WEBHOOK_MAX_BODY_BYTES": str(MAX_BODY_BYTES),
    }
    off_env = {**env, "BILLING_PROVIDER": "none", "CLERK_WEBHOOK_SIGNING_SECRET": ""}
    logs = [tmp_path / "api.log", tmp_path / "api-switched-off.log"]
    secrets = {**SECRETS, "stripe": webhook_secrets["stripe"], "clerk": webhook_secrets["clerk"]}
    with ExitStack() as stack:
        base_url = stack.enter_context(logged_api_process(env, logs[0], API_FACTORY))
        off_url = stack.enter_context(logged_api_process(off_env, logs[1], API_FACTORY))
        client = stack.enter_context(httpx.Client(base_url=base_url, timeout=15))
        switched_off = stack.enter_context(httpx.Client(base_url=off_url, timeout=15))
        schema = client.get("/schema").json()
        routes, others = webhook_operations(schema), other_post_paths(schema)
        assert {route.provider for route in routes.values()} == {"stripe", "clerk"}, sorted(routes)
        assert others, "the developer's POST route is not in the document"
        yield Run(base_url, secrets, routes, others, client, switched_off)
    # Both processes have stopped, so whatever their Sentry clients held was sent.
    sent = sentry.sent_bytes()
    leaked = _leaks(b"".join(log.read_bytes() for log in logs) + sent, [*secrets.values(), DB_PASSWORD, PLANTED])
    assert not leaked, f"found in the logs or Sentry: {leaked}"
    assert sentry.events == [], f"Sentry received {len(sentry.events)} event(s): {sent[:2000]!r}"


def _leaks(text: bytes, values: list[str]) -> list[str]:
    return [value[:12] + "..." for value in values if value.encode() in text]


# Bodies -----------------------------------------------------------------------------------------------

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


_raw_values = st.one_of(
    st.sampled_from(["1e400", "-1e400", "9" * 5000, "1e-20000", '"\\ud800"', '"a\\u0000b"', "[[[[", "{", "nul"]),
    st.integers(min_value=60, max_value=70).map(_nested),
    st.sampled_from([_nested(1000), _nested(10_000)]),
    _json.map(json.dumps),
)
_ids = st.one_of(
    st.text(min_size=1, max_size=40).map(lambda s: json.dumps("evt_" + s)),
    st.sampled_from(['"evt_' + "x" * 300 + '"', '"evt_\\u0000"', "42", "null", '""', "[]", '"' + "é" * 200 + '"']),
)


@st.composite
def hostile_body(draw: st.DrawFn) -> bytes:
    """A body built as text, so it can hold what no JSON encoder writes (1e400, lone surrogates, garbage)."""
    if draw(st.booleans()):
        return PLANTED.encode() + draw(st.binary(max_size=200))
    event_id, value = draw(_ids), draw(_raw_values)
    event_type = draw(
        st.sampled_from(['"customer.subscription.updated"', '"user.created"', '"x' * 1 + "y" * 300 + '"', "7"])
    )
    return f'{{"id": {event_id}, "type": {event_type}, "note": "{PLANTED}", "v": {value}}}'.encode(errors="replace")


@st.composite
def header_value(draw: st.DrawFn) -> bytes:
    text = draw(
        st.one_of(st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=60), st.just(""))
    )
    size = draw(st.sampled_from([1, 1, 1, 200]))
    return (text * size)[:12000].encode("latin-1")


# Deliveries -----------------------------------------------------------------------------------------------


def _stripe_signed(body: bytes, secret: str, skew: int) -> dict[str, Any]:
    header = WebhookSignature.generate_signature_header(
        body.decode(errors="replace"), secret, timestamp=int(time.time()) + skew
    )
    return {"Stripe-Signature": header}


def _clerk_signed(body: bytes, secret: str, msg_id: str) -> dict[str, Any]:
    when = datetime.now(UTC)
    return {
        "svix-id": msg_id,
        "svix-timestamp": str(int(when.timestamp())),
        "svix-signature": Webhook(secret).sign(msg_id, when, body.decode(errors="replace")),
    }


@dataclass(frozen=True)
class Attempt:
    path: str
    body: bytes
    headers: dict[str, Any]
    signed: bool
    event_id: str | None = None
    """Clerk's event id (the svix-id) of a signed delivery; Stripe's is in the body."""
    status: int | None = None
    """The answer it must get whatever else it is: 413 over the size limit, 404 from the switched-off API."""
    switched_off: bool = False
    chunked: bool = False
    """Sent without Content-Length, so the limit is met while the body streams in."""

    def __repr__(self) -> str:
        """What Hypothesis prints of a failing example: the body's first bytes and its size, not 64 KB of it."""
        body = f"{self.body[:120]!r}{'...' if len(self.body) > 120 else ''} ({len(self.body)} bytes)"
        flags = f"signed={self.signed}, status={self.status}, switched_off={self.switched_off}, chunked={self.chunked}"
        return f"Attempt(path={self.path!r}, body={body}, headers={_short(self.headers)}, {flags})"

    def _repr_pretty_(self, printer: Any, _cycle: bool) -> None:
        """Hypothesis' printer asks this (the IPython protocol) before it would list every field in full."""
        printer.text(repr(self))


def _short(headers: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{name!r}: {value[:80]!r}" for name, value in headers.items()) + "}"


# The kinds of request, the first three as often as before the last two were added.
_KINDS = ["unsigned"] * 3 + ["signed-hostile"] * 3 + ["signed-valid"] * 3 + ["too-large", "switched-off"]


@st.composite
def request(draw: st.DrawFn, run: Run) -> Attempt:
    headers: dict[str, Any] = {"Content-Type": draw(st.sampled_from([b"application/json", b"text/plain", b"x/\xff"]))}
    if draw(st.integers(0, 9)) == 0:  # one request in ten to a route of the developer's
        return draw(_to_another_route(run, headers))
    path = draw(st.sampled_from(sorted(run.routes)))
    provider = run.routes[path].provider
    kind = draw(st.sampled_from(_KINDS))
    if kind in ("too-large", "switched-off"):
        return draw(_refused_whatever_it_is(path, provider, headers, run, switched_off=kind == "switched-off"))
    if kind == "unsigned":
        headers |= {name: draw(header_value()) for name in run.routes[path].headers if draw(st.booleans())}
        return Attempt(path, draw(hostile_body()), headers, signed=False)
    if kind == "signed-hostile":
        body = draw(hostile_body())
    else:
        event_type = "customer.subscription.updated" if provider == "stripe" else "user.updated"
        event_id = f"evt_fuzz_{draw(st.uuids()).hex}"
        body = json.dumps(
            {"id": event_id, "type": event_type, "note": PLANTED, "data": {"object": draw(_json)}}
        ).encode()
    if provider == "stripe":
        skew = draw(st.sampled_from([0, 0, 0, 3600, -3600]))  # an hour ahead or behind: refused
        headers |= _stripe_signed(body, run.secrets["stripe"], skew)
        return Attempt(path, body, headers, signed=skew == 0)
    msg_id = draw(st.one_of(st.uuids().map(lambda u: f"msg_{u.hex}"), st.sampled_from(["msg_" + "x" * 300, "msg_~!&"])))
    headers |= _clerk_signed(body, run.secrets["clerk"], msg_id)
    return Attempt(path, body, headers, signed=True, event_id=msg_id)


@st.composite
def _to_another_route(draw: st.DrawFn, run: Run, headers: dict[str, Any]) -> Attempt:
    """A hostile body, path parameters and signature headers to a POST route that is not a webhook route."""
    template = draw(st.sampled_from(run.other_routes))
    values = st.one_of(st.integers(0, 2**31), st.integers(), st.text(min_size=1, max_size=30))
    path = re.sub(r"\{[^}]+\}", lambda _: quote(str(draw(values)), safe=""), template)
    names = [name for route in run.routes.values() for name in route.headers]
    headers |= {name: draw(header_value()) for name in names if draw(st.booleans())}
    fitting = st.fixed_dictionaries({"text": st.text(max_size=40)}).map(lambda value: json.dumps(value).encode())
    body = draw(st.one_of(hostile_body(), fitting))
    return Attempt(path, body, headers, signed=False)


@st.composite
def _refused_whatever_it_is(
    draw: st.DrawFn, path: str, provider: str, headers: dict[str, Any], run: Run, *, switched_off: bool
) -> Attempt:
    """A body over the size limit (413), or any body to a switched-off provider (404): signed or not, valid
    or not, it is refused before anything parses it."""
    body = draw(hostile_body())
    if switched_off:
        size = draw(st.sampled_from([0, 0, 0, MAX_BODY_BYTES + 1, 2 * 1024 * 1024]))
    else:
        size = draw(st.sampled_from([MAX_BODY_BYTES + 1, MAX_BODY_BYTES + 1000, 4 * MAX_BODY_BYTES, 2 * 1024 * 1024]))
    if len(body) < size:
        body += b" " * (size - len(body))
    if draw(st.booleans()):
        secret = run.secrets[provider]
        headers |= _stripe_signed(body, secret, 0) if provider == "stripe" else _clerk_signed(body, secret, "msg_big")
    chunked = not switched_off and draw(st.booleans())
    return Attempt(
        path,
        body,
        headers,
        signed=False,
        status=404 if switched_off else 413,
        switched_off=switched_off,
        chunked=chunked,
    )


HANDLED = {"stripe": ("customer.subscription.",), "clerk": ("user.",)}


def _must_store(attempt: Attempt, routes: dict[str, WebhookOperation]) -> tuple[str, str] | None:
    """The oracle, written apart from the code under test (stdlib json): the inbox key a delivery must create."""
    if not attempt.signed or attempt.status is not None or attempt.path not in routes:
        return None
    provider = routes[attempt.path].provider
    try:
        text = attempt.body.decode("utf-8")
        payload = json.loads(text, parse_constant=lambda name: float("nan"))
        text.encode("utf-8")
        json.dumps(payload, ensure_ascii=False).encode("utf-8")  # lone surrogates cannot be encoded
        if not isinstance(payload, dict) or _depth(payload) > 64 or not _numbers_fit(payload):
            return None
    except (ValueError, RecursionError, UnicodeError):
        return None
    event_id = attempt.event_id if provider == "clerk" else payload.get("id")
    event_type = payload.get("type")
    for value in (event_id, event_type):
        if not isinstance(value, str) or not 0 < len(value) <= 255 or "\x00" in value:
            return None
    if not str(event_type).startswith(HANDLED[provider]):
        return None
    return provider, str(event_id)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _numbers_fit(value: Any) -> bool:
    if isinstance(value, float):
        return value == value and abs(value) != float("inf")
    if isinstance(value, dict):
        return all(_numbers_fit(v) for v in value.values())
    if isinstance(value, list):
        return all(_numbers_fit(v) for v in value)
    return True


def _chunks(body: bytes, size: int = 16384) -> Iterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


def _send(run: Run, attempt: Attempt) -> int:
    client = run.switched_off if attempt.switched_off else run.client
    content = _chunks(attempt.body) if attempt.chunked else attempt.body
    try:
        response = client.post(attempt.path, content=content, headers=attempt.headers)
    except httpx.LocalProtocolError:  # a header the client itself refuses to send: not a request
        return 0
    run.requests += 1
    answers = run.answers if attempt.path in run.routes else run.other_answers
    answers[response.status_code] = answers.get(response.status_code, 0) + 1
    return response.status_code


async def _inbox_keys(database_url: str) -> set[tuple[str, str]]:
    connection = await asyncpg.connect(make_url(database_url).set(drivername="postgresql").render_as_string(False))
    try:
        return {
            (r["provider"], r["event_id"])
            for r in await connection.fetch("SELECT provider, event_id FROM webhook_event")
        }
    finally:
        await connection.close()


def test_hostile_requests_get_no_5xx_store_nothing_and_leak_nothing(
    run: Run, settings_env: dict[str, str], fuzz_examples: int
) -> None:
    @settings(max_examples=fuzz_examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(data=st.data())
    def one(data: st.DataObject) -> None:
        attempt = data.draw(request(run))
        status = _send(run, attempt)
        assert status < 500, status
        if attempt.status is not None and status:
            assert status == attempt.status
        key = _must_store(attempt, run.routes)
        if key is not None:
            assert status == 200, (status, key)
            run.expected.add(key)

    one()
    for path in ("/health", "/ready", "/schema", "/webhooks/nowhere"):
        assert run.client.get(path).status_code < 500
    assert run.answers.get(413) and run.answers.get(404), run.answers  # both kinds were sent
    assert any(200 <= status < 300 for status in run.other_answers), run.other_answers  # some fitted
    assert run.other_answers.get(400), run.other_answers  # some did not
    import asyncio

    stored = asyncio.run(_inbox_keys(settings_env["DATABASE_URL"]))
    assert stored == run.expected, "rows stored from bad input" if stored - run.expected else "valid events lost"
    answers = {"webhooks": dict(sorted(run.answers.items())), "others": dict(sorted(run.other_answers.items()))}
    print(f"fuzz: {run.requests} requests, answers {answers}, {len(stored)} stored")
