"""No Sentry item or log line carries a configured secret or a request body (docs/operations.md)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
from litestar import Request, post
from litestar.di import NamedDependency
from litestar.testing import AsyncTestClient
from sqlalchemy.engine import make_url

from app.asgi import build_app
from app.core.logging import configure_logging
from app.core.module import ApiPart, FeatureModule
from app.core.resources import Resources
from app.core.sentry import flush_sentry, init_sentry
from app.core.settings import load_settings
from app.queue.job import Job
from app.runtime import open_resources
from app.system import module as system
from tests.stubs.sentry_ingest import SentryIngestStub, exception_types

DB_PASSWORD = "s3cretPw"
STRIPE_API_KEY = "sk_live_stripe_key_never_sent"
CLERK_SECRET_KEY = "sk_live_clerk_key_never_sent"
OPS_PASSWORD = "ops-password-never-sent"
METRICS_TOKEN = "metrics-token-never-sent"
PLANTED_BODY = "planted-card-4242-never-sent"


class LeakyRouteError(Exception):
    pass


@post("/leaky", status_code=200)
async def leaky_route(request: Request[Any, Any, Any], resources: NamedDependency[Resources]) -> None:
    """Fails the way a real handler does: the body and the settings are frame locals."""
    body = await request.body()
    settings = resources.settings
    api_key = settings.stripe_api_key
    logging.getLogger("tests.leaky").info("calling Stripe with %s for %s", api_key, settings.database_url)
    raise LeakyRouteError(f"the call with {api_key} to {settings.database_url} failed ({len(body)} bytes)")


LEAKY = FeatureModule(name="leaky", api=ApiPart(route_handlers=[leaky_route]))


class LeakyData(msgspec.Struct, frozen=True):
    card: str


class LeakyJob(Job[LeakyData]):
    """Fails holding the settings and the job's data in its frame."""

    async def handle(self, data: LeakyData) -> None:
        settings = self.resources.settings
        password = settings.ops_password
        raise RuntimeError(f"could not log in with {password} or {settings.clerk_secret_key} for {data.card[:4]}")


@pytest.fixture
def secret_env(settings_env: dict[str, str]) -> dict[str, str]:
    """The test environment with every secret set, and a password in DATABASE_URL (trust auth ignores it)."""
    database_url = make_url(settings_env["DATABASE_URL"]).set(password=DB_PASSWORD)
    return {
        **settings_env,
        "DATABASE_URL": database_url.render_as_string(hide_password=False),
        "STRIPE_API_KEY": STRIPE_API_KEY,
        "CLERK_SECRET_KEY": CLERK_SECRET_KEY,
        "OPS_PASSWORD": OPS_PASSWORD,
        "METRICS_TOKEN": METRICS_TOKEN,
    }


def _secrets(env: dict[str, str]) -> list[str]:
    return [
        STRIPE_API_KEY,
        env["STRIPE_WEBHOOK_SECRET"],
        env["CLERK_WEBHOOK_SIGNING_SECRET"],
        DB_PASSWORD,
        CLERK_SECRET_KEY,
        OPS_PASSWORD,
        METRICS_TOKEN,
    ]


def _leaks(sent: bytes, env: dict[str, str]) -> list[str]:
    return [value for value in [*_secrets(env), PLANTED_BODY] if value.encode() in sent]


def _frames(event: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for value in event.get("exception", {}).get("values", []):
        yield from (value.get("stacktrace") or {}).get("frames", [])
    for thread in event.get("threads", {}).get("values", []):
        yield from (thread.get("stacktrace") or {}).get("frames", [])


async def test_a_failing_request_reaches_sentry_without_secrets_locals_or_its_body(
    secret_env: dict[str, str], sentry_enabled: SentryIngestStub
) -> None:
    settings = load_settings({**secret_env, "SENTRY_DSN": sentry_enabled.dsn})
    async with AsyncTestClient(build_app(settings, [system.MODULE, LEAKY])) as client:
        response = await client.post(
            "/leaky",
            json={"card": PLANTED_BODY},
            headers={"Authorization": f"Bearer {METRICS_TOKEN}", "Cookie": f"session={OPS_PASSWORD}"},
        )
    assert response.status_code == 500
    flush_sentry(timeout=5)
    events = sentry_enabled.wait_for(lambda items: any("LeakyRouteError" in exception_types(e) for e in items))
    (event,) = [e for e in events if "LeakyRouteError" in exception_types(e)]
    assert event["tags"]["method"] == "POST" and event["tags"]["path"] == "/leaky"
    assert "[Filtered]" in event["exception"]["values"][-1]["value"]
    assert [frame for frame in _frames(event) if frame.get("function") == "leaky_route"]
    assert all("vars" not in frame for frame in _frames(event))
    assert _leaks(sentry_enabled.sent_bytes(), secret_env) == []


async def test_a_failed_job_attempt_reaches_sentry_without_secrets_locals_or_its_data(
    secret_env: dict[str, str], sentry_enabled: SentryIngestStub
) -> None:
    settings = load_settings({**secret_env, "MESSAGE_QUEUE_DRIVER": "sync", "SENTRY_DSN": sentry_enabled.dsn})
    init_sentry(settings, "worker")
    resources = open_resources(settings, ())
    try:
        with pytest.raises(RuntimeError, match="could not log in"):
            await resources.queue.add(LeakyJob, LeakyData(card=PLANTED_BODY))
    finally:
        await resources.close()
    flush_sentry(timeout=5)
    events = sentry_enabled.wait_for(lambda items: any(e.get("tags", {}).get("job_name") for e in items))
    (event,) = [e for e in events if e.get("tags", {}).get("job_name") == "LeakyJob"]
    assert exception_types(event) == ["RuntimeError"]
    assert [frame for frame in _frames(event) if frame.get("function") == "handle"]
    assert all("vars" not in frame for frame in _frames(event))
    assert _leaks(sentry_enabled.sent_bytes(), secret_env) == []


async def test_a_malformed_json_body_is_a_400_with_sentry_on(
    settings_env: dict[str, str], sentry_enabled: SentryIngestStub
) -> None:
    """Nothing may parse the body before the signature check (Sentry's Litestar integration did)."""
    settings = load_settings({**settings_env, "SENTRY_DSN": sentry_enabled.dsn})
    async with AsyncTestClient(build_app(settings)) as client:
        response = await client.post(
            "/webhooks/stripe", content=b"this is not json", headers={"Content-Type": "application/json"}
        )
    assert response.status_code == 400, response.text
    flush_sentry(timeout=5)
    assert sentry_enabled.events == []


def _log_a_failure_with_a_secret(secret: str) -> None:
    card_number = "4242-4242-local-never-printed"  # a frame local that no setting names

    def charge() -> None:
        raise RuntimeError(f"the charge with {secret} failed for card ending {card_number[-4:]}")

    try:
        charge()
    except RuntimeError:
        logging.getLogger("tests.secrets").exception("Charging failed with key %s", secret)


@pytest.mark.parametrize("log_format", ["console", "json"])
def test_log_lines_show_no_frame_locals_and_no_configured_secret(
    settings_env: dict[str, str], secret_env: dict[str, str], log_format: str, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging(load_settings({**secret_env, "LOG_FORMAT": log_format}))
    try:
        _log_a_failure_with_a_secret(STRIPE_API_KEY)
        logging.getLogger("tests.secrets").warning("Postgres at %s is slow", load_settings(secret_env).database_url)
    finally:
        output = capsys.readouterr().err
        configure_logging(load_settings(settings_env))
    assert "in charge" in output or '"charge"' in output  # the traceback itself is there
    assert "4242-4242-local-never-printed" not in output
    assert STRIPE_API_KEY not in output
    assert DB_PASSWORD not in output
    assert "Charging failed with key [Filtered]" in output
    if log_format == "json":
        (failure,) = [json.loads(line) for line in output.splitlines() if "Charging failed" in line]
        assert "[Filtered]" in failure["exception"][0]["exc_value"]


class _StripeClient:
    """An object whose repr shows its key, as SDK clients' often do."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __repr__(self) -> str:
        return f"_StripeClient(key={self.key!r})"


@dataclass
class _Call:
    """A JSON encoder writes every field of a dataclass, the one its repr hides too."""

    url: str
    password: str = field(repr=False)


ODD_DB_PASSWORD = 'pw"with\\quote-é'


def _escaped_forms(secret: str) -> set[str]:
    """How a renderer may write ``secret``: in a repr, in a JSON string, and a repr inside a JSON string."""
    in_repr = repr(secret)[1:-1]
    return {
        secret,
        in_repr,
        json.dumps(secret)[1:-1],
        json.dumps(in_repr)[1:-1],
        json.dumps(in_repr, ensure_ascii=False)[1:-1],
    }


@pytest.mark.parametrize("log_format", ["console", "json"])
def test_a_secret_inside_any_value_passed_to_a_line_is_scrubbed(
    settings_env: dict[str, str], secret_env: dict[str, str], log_format: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not only strings: objects printed through their repr, dataclasses encoded field by field, nested ones."""
    database_url = make_url(secret_env["DATABASE_URL"]).set(password=ODD_DB_PASSWORD)
    env = {**secret_env, "DATABASE_URL": database_url.render_as_string(hide_password=False)}
    configure_logging(load_settings({**env, "LOG_FORMAT": log_format}))
    try:
        logging.getLogger("tests.secrets").warning(
            "Calling Stripe",
            extra={
                "client": _StripeClient(STRIPE_API_KEY),
                "call": _Call("https://ops.example", OPS_PASSWORD),
                "nested": {"clients": [_StripeClient(ODD_DB_PASSWORD)], "pair": (_StripeClient(METRICS_TOKEN),)},
            },
        )
    finally:
        output = capsys.readouterr().err
        configure_logging(load_settings(settings_env))
    (line,) = [line for line in output.splitlines() if "Calling Stripe" in line]
    for secret in (STRIPE_API_KEY, OPS_PASSWORD, METRICS_TOKEN, ODD_DB_PASSWORD):
        assert [form for form in _escaped_forms(secret) if form in line] == [], (secret, line)
    assert "_StripeClient(key=[Filtered])" in line or "_StripeClient(key='[Filtered]')" in line
    assert line.count("[Filtered]") >= 3  # the console shows the repr, which leaves the password out
    if log_format == "json":
        parsed = json.loads(line)  # still one valid JSON object
        assert parsed["call"] == {"url": "https://ops.example", "password": "[Filtered]"}
        assert parsed["client"] == "_StripeClient(key='[Filtered]')"
