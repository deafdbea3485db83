"""Liveness and readiness against the real servers, and against dead ones."""

from __future__ import annotations

import time

from litestar.testing import AsyncTestClient

from app.asgi import build_app
from app.core.settings import load_settings


async def test_health_and_ready_answer_200_with_both_servers_up(settings_env: dict[str, str]) -> None:
    async with AsyncTestClient(build_app(load_settings(settings_env))) as client:
        assert (await client.get("/health")).status_code == 200
        ready = await client.get("/ready")
    assert ready.status_code == 200
    assert ready.json() == {"postgres": "ok", "redis": "ok"}


async def test_ready_names_the_dead_dependency(settings_env: dict[str, str]) -> None:
    env = {**settings_env, "REDIS_URL": "redis://127.0.0.1:1/0"}
    async with AsyncTestClient(build_app(load_settings(env))) as client:
        started = time.monotonic()
        ready = await client.get("/ready")
        elapsed = time.monotonic() - started
        assert (await client.get("/health")).status_code == 200
    assert ready.status_code == 503
    body = ready.json()
    assert body["postgres"] == "ok"
    assert body["redis"].startswith("error: ")
    assert elapsed < 3


async def test_ready_reports_postgres_down(settings_env: dict[str, str]) -> None:
    env = {**settings_env, "DATABASE_URL": "postgresql+asyncpg://postgres@127.0.0.1:1/test"}
    async with AsyncTestClient(build_app(load_settings(env))) as client:
        ready = await client.get("/ready")
    assert ready.status_code == 503
    assert ready.json()["postgres"].startswith("error: ")
    assert ready.json()["redis"] == "ok"


async def test_every_response_carries_a_request_id(settings_env: dict[str, str]) -> None:
    async with AsyncTestClient(build_app(load_settings(settings_env))) as client:
        fresh = await client.get("/health")
        echoed = await client.get("/health", headers={"X-Request-ID": "abc-123"})
    assert len(fresh.headers["x-request-id"]) == 32
    assert echoed.headers["x-request-id"] == "abc-123"
