"""Every connection to Postgres carries TCP keepalives; the API's also carry a statement timeout (docs/behaviour.md).

A worker host that vanishes without closing its sockets must lose its locks
within 60 s, and a stuck database must answer the API's statements with an
error (503), not hang them: both are session settings Postgres reports.
"""

from __future__ import annotations

from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import text

from app.asgi import API_STATEMENT_TIMEOUT_SECONDS, build_app
from app.core.db import Database, driver_connection
from app.core.settings import Settings
from app.runtime import open_resources

KEEPALIVES = {"tcp_keepalives_idle": "15", "tcp_keepalives_interval": "5", "tcp_keepalives_count": "4"}  # seconds
NAMES = [*KEEPALIVES, "statement_timeout"]


async def _through_a_session(db: Database) -> dict[str, str]:
    async with db.session() as session:
        if await session.scalar(text("SELECT inet_client_addr()")) is None:
            pytest.skip("Postgres is reached through a Unix socket here, which has no TCP keepalives")
        return {name: str(await session.scalar(text(f"SHOW {name}"))) for name in NAMES}


async def _through_a_driver_connection(db: Database) -> dict[str, Any]:
    """The intake's and the processing's path: a raw asyncpg connection of the same pool."""
    async with driver_connection(db) as connection:
        return {name: await connection.fetchval(f"SHOW {name}") for name in NAMES}


async def test_the_apis_connections_carry_keepalives_and_its_statement_timeout(settings: Settings) -> None:
    async with AsyncTestClient(build_app(settings)) as client:
        db = (await client.app.dependencies["resources"]()).db  # the app's own, as its routes are injected with
        seen = [await _through_a_session(db), await _through_a_driver_connection(db)]
    timeout = f"{API_STATEMENT_TIMEOUT_SECONDS:g}s"
    assert seen == [{**KEEPALIVES, "statement_timeout": timeout}] * 2


async def test_the_workers_connections_carry_keepalives_and_no_statement_timeout(settings: Settings) -> None:
    """A job's statements may run long (a retention batch, a reconcile): only the idle timeouts bound them,
    and only while an event's lock is held (tests/webhooks/test_stuck_events.py)."""
    resources = open_resources(settings, (), pool_size=settings.worker_max_jobs)  # as the worker opens them
    try:
        seen = [await _through_a_session(resources.db), await _through_a_driver_connection(resources.db)]
    finally:
        await resources.close()
    assert seen == [{**KEEPALIVES, "statement_timeout": "0"}] * 2
