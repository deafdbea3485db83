"""Sentry gets server faults (not 4xx); logs are JSON lines with the request id in production format."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from litestar import get
from litestar.exceptions import NotFoundException
from litestar.testing import AsyncTestClient

from app.asgi import build_app
from app.core.logging import configure_logging
from app.core.module import ApiPart, FeatureModule
from app.core.settings import load_settings
from app.system import module as system
from tests.stubs.sentry_ingest import SentryIngestStub, exception_types


class ExplodingRouteError(Exception):
    pass


@get("/boom")
async def boom() -> None:
    raise ExplodingRouteError("the route broke")


@get("/missing")
async def missing() -> None:
    raise NotFoundException(detail="no such thing")


LOCAL_SECRET = "sk_live_never_in_a_log_line"


@get("/leaky")
async def leaky() -> None:
    api_key = LOCAL_SECRET  # a frame local, as settings and request bodies are in real handlers
    raise ExplodingRouteError(f"the call with a {len(api_key)}-character key failed")


FAULTY = FeatureModule(name="faulty", api=ApiPart(route_handlers=[boom, missing, leaky]))


async def test_unhandled_error_reaches_sentry_and_a_4xx_does_not(
    settings_env: dict[str, str], sentry_enabled: SentryIngestStub
) -> None:
    settings = load_settings({**settings_env, "SENTRY_DSN": sentry_enabled.dsn})
    async with AsyncTestClient(build_app(settings, [system.MODULE, FAULTY])) as client:
        assert (await client.get("/missing")).status_code == 404
        assert (await client.get("/boom")).status_code == 500
    import sentry_sdk

    sentry_sdk.flush(timeout=5)
    events = sentry_enabled.wait_for(lambda items: len(items) >= 1)
    assert [exception_types(e) for e in events] == [["ExplodingRouteError"]]
    assert not any("NotFoundException" in exception_types(e) for e in events)


async def test_json_log_lines_carry_the_request_id(
    settings_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    settings = load_settings({**settings_env, "LOG_FORMAT": "json"})
    app = build_app(settings, [system.MODULE])
    async with AsyncTestClient(app) as client:
        response = await client.get("/health", headers={"X-Request-ID": "req-42"})
    assert response.status_code == 200
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    access: list[dict[str, Any]] = [line for line in lines if line.get("logger") == "app.core.request_context"]
    assert access, lines
    assert access[-1]["request_id"] == "req-42"
    assert access[-1]["status"] == 200
    assert access[-1]["level"] == "info"
    configure_logging(load_settings(settings_env))
    logging.getLogger("app").info("back to console")


async def test_json_tracebacks_carry_no_frame_locals(
    settings_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Locals would put the settings' secrets (and request bodies) in every logged traceback."""
    settings = load_settings({**settings_env, "LOG_FORMAT": "json"})
    async with AsyncTestClient(build_app(settings, [system.MODULE, FAULTY])) as client:
        assert (await client.get("/leaky")).status_code == 500
    output = capsys.readouterr().err
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    (error,) = [line for line in lines if str(line.get("event", "")).startswith("Unhandled error on GET /leaky")]
    frames = error["exception"][0]["frames"]
    assert frames and frames[-1]["name"] == "leaky"
    assert all("locals" not in frame for frame in frames)
    assert LOCAL_SECRET not in output
    assert settings_env["STRIPE_WEBHOOK_SECRET"] not in output
    configure_logging(load_settings(settings_env))
