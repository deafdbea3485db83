"""Fixtures of the webhook tests: the API in process on real Postgres and Redis, and a recording handler."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from app.asgi import build_app
from app.billing.handlers import STRIPE_EVENTS
from app.core.db import driver_connection
from app.core.module import FeatureModule
from app.core.resources import Resources
from app.core.settings import load_settings
from app.identity.handlers import CLERK_EVENTS
from app.system import module as system
from app.webhooks.handlers import EventRoutes, WebhookContext
from app.webhooks.models import WebhookEvent
from app.webhooks.module import build_webhooks_module
from app.webhooks.routes import intake_api


@dataclass
class RecordingHandlers:
    """Handlers that record each event they process and fail while ``failing`` says so."""

    seen: list[tuple[str, str]] = field(default_factory=list)
    failing: bool = False

    async def handle(self, context: WebhookContext) -> None:
        if self.failing:
            raise RuntimeError(f"handler failure for {context.event.event_id}")
        self.seen.append((context.event.provider, context.event.event_id))

    def module(self) -> FeatureModule:
        """Handles the types billing and identity handle (so unhandled ones are still dropped at intake)."""
        return FeatureModule(
            name="recording",
            webhook_handlers={
                "stripe": EventRoutes(dict.fromkeys(STRIPE_EVENTS.subjects, self.handle)),
                "clerk": EventRoutes(dict.fromkeys(CLERK_EVENTS.routes, self.handle)),
            },
        )


@pytest.fixture
def recording() -> RecordingHandlers:
    return RecordingHandlers()


@pytest.fixture
async def make_client(settings_env: dict[str, str], recording: RecordingHandlers) -> AsyncIterator[Callable[..., Any]]:
    """Build the API with env overrides; returns an entered AsyncTestClient."""
    clients: list[AsyncTestClient[Any]] = []

    async def make(providers: Any = None, extra_modules: tuple[FeatureModule, ...] = (), **env: str) -> Any:
        settings = load_settings({**settings_env, **env})
        webhooks = build_webhooks_module(providers, intake_api(providers)) if providers else build_webhooks_module()
        modules = [system.MODULE, webhooks, recording.module(), *extra_modules]
        client: AsyncTestClient[Any] = AsyncTestClient(build_app(settings, modules))
        await client.__aenter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.__aexit__(None, None, None)


@pytest.fixture
async def client(make_client: Callable[..., Any]) -> Any:
    return await make_client()


async def inbox_rows(resources: Resources) -> list[WebhookEvent]:
    async with resources.db.session() as session:
        return list((await session.scalars(select(WebhookEvent).order_by(WebhookEvent.id))).all())


async def inbox_count(resources: Resources) -> int:
    async with resources.db.session() as session:
        return int(await session.scalar(select(func.count()).select_from(WebhookEvent)) or 0)


async def kill_pooled_connection(resources: Resources) -> None:
    """Terminate the backend of the pool's idle connection, as a Postgres restart does to every pooled one.

    Returns once the client side has seen the close too, so the next statement
    on it fails with "connection is closed" rather than racing the FATAL message.
    """
    async with driver_connection(resources.db) as connection:
        backend = await connection.fetchval("SELECT pg_backend_pid()")
        pooled = connection
    url = make_url(resources.settings.require_database_url()).set(drivername="postgresql")
    admin = await asyncpg.connect(url.render_as_string(hide_password=False))
    try:
        await admin.execute("SELECT pg_terminate_backend($1)", backend)
        for _ in range(100):
            if not await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", backend):
                break
            await asyncio.sleep(0.02)
    finally:
        await admin.close()
    for _ in range(100):
        if pooled.is_closed():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the client never saw backend {backend} close")
