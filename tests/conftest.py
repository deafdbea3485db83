"""Test fixtures: a real Postgres database per test session, a Redis namespace per test.

The servers come from ``TEST_DATABASE_URL`` / ``TEST_REDIS_URL`` (``make test``
sets them: local servers when they answer, else embedded ones). Each pytest
process (xdist worker) migrates its own database, so runs in parallel never
share rows; each test starts on emptied tables and its own Redis key prefix.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest
from alembic.config import Config
from sqlalchemy.engine import make_url

from alembic import command
from app.core.db import metadata
from app.core.resources import Resources
from app.core.settings import Settings, load_settings
from app.runtime import all_models, open_resources
from app.testing.deliveries import generate_whsec
from tests.stubs.sentry_ingest import SentryIngestStub

DEFAULT_DATABASE_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _admin_dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _migrate(url: str, revision: str = "head", *, down: bool = False) -> None:
    config = Config(os.path.join(ROOT, "alembic.ini"))
    config.set_main_option("script_location", os.path.join(ROOT, "alembic"))
    config.attributes["db_url"] = url
    (command.downgrade if down else command.upgrade)(config, revision)


async def create_database(base_url: str, name: str) -> str:
    connection = await asyncpg.connect(_admin_dsn(base_url))
    try:
        await connection.execute(f'CREATE DATABASE "{name}"')
    finally:
        await connection.close()
    return make_url(base_url).set(database=name).render_as_string(hide_password=False)


async def drop_database(base_url: str, name: str) -> None:
    connection = await asyncpg.connect(_admin_dsn(base_url))
    try:
        await connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await connection.close()


@pytest.fixture(scope="session")
def base_database_url() -> str:
    return os.environ.get("TEST_DATABASE_URL") or DEFAULT_DATABASE_URL


@pytest.fixture(scope="session")
def redis_url() -> str:
    return os.environ.get("TEST_REDIS_URL") or DEFAULT_REDIS_URL


@pytest.fixture(scope="session")
def database_url(base_database_url: str) -> Iterator[str]:
    """A migrated database of this test process, dropped at the end."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    url = asyncio.run(create_database(base_database_url, name))
    _migrate(url)
    yield url
    asyncio.run(drop_database(base_database_url, name))


@pytest.fixture(scope="session")
def webhook_secrets() -> dict[str, str]:
    return {"stripe": generate_whsec(), "stripe_old": generate_whsec(), "clerk": generate_whsec()}


@pytest.fixture
def redis_namespace() -> str:
    return f"t{uuid.uuid4().hex[:10]}:"


@pytest.fixture
def settings_env(
    database_url: str, redis_url: str, redis_namespace: str, webhook_secrets: dict[str, str]
) -> dict[str, str]:
    """The environment of the app under test; tests change entries, then build ``settings``."""
    return {
        "APP_ENV": "test",
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "REDIS_NAMESPACE": redis_namespace,
        "STRIPE_WEBHOOK_SECRET": webhook_secrets["stripe"],
        "CLERK_WEBHOOK_SIGNING_SECRET": webhook_secrets["clerk"],
        "STRIPE_API_KEY": "sk_test_123",
        "LOG_LEVEL": "info",
    }


@pytest.fixture
def settings(settings_env: dict[str, str]) -> Settings:
    return load_settings(settings_env)


@pytest.fixture(autouse=True)
async def _clean_state(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Empty every table before a test that uses the database; drop the test's Redis keys after."""
    if "database_url" in request.fixturenames:
        url: str = request.getfixturevalue("database_url")
        all_models()  # every module's tables are in ``metadata``
        tables = ", ".join(f'"{table.name}"' for table in metadata.sorted_tables)
        connection = await asyncpg.connect(_admin_dsn(url))
        try:
            await connection.execute(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")
        finally:
            await connection.close()
    namespace = request.getfixturevalue("redis_namespace") if "redis_namespace" in request.fixturenames else None
    yield
    if namespace:
        await _drop_redis_keys(request.getfixturevalue("redis_url"), namespace)


async def _drop_redis_keys(url: str, namespace: str) -> None:
    from redis.asyncio import Redis

    client = Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    try:
        for pattern in (f"{namespace}*", f"arq:*:{namespace}*"):
            keys = [key async for key in client.scan_iter(match=pattern, count=1000)]
            if keys:
                await client.delete(*keys)
    except OSError:
        pass  # a test that stopped Redis on purpose
    finally:
        await client.aclose()


@pytest.fixture
async def resources(settings: Settings) -> AsyncIterator[Resources]:
    opened = open_resources(settings, ())
    yield opened
    await opened.close()


@pytest.fixture
def sentry_stub() -> Iterator[SentryIngestStub]:
    stub = SentryIngestStub().start()
    yield stub
    stub.stop()


@pytest.fixture
def sentry_enabled(sentry_stub: SentryIngestStub) -> Iterator[SentryIngestStub]:
    """Sentry on in this process, pointed at the stub; switched off again afterwards."""
    import sentry_sdk

    yield sentry_stub
    sentry_sdk.flush(timeout=2)
    sentry_sdk.init(dsn=None, auto_enabling_integrations=False)  # auto-enabled ones would patch Litestar


def pytest_addoption(parser: Any) -> None:
    parser.addoption("--fuzz-examples", type=int, default=2500, help="requests the intake fuzz test sends")


@pytest.fixture
def fuzz_examples(request: pytest.FixtureRequest) -> int:
    return int(request.config.getoption("--fuzz-examples"))


def pytest_configure(config: Any) -> None:
    os.environ.setdefault("APP_ENV", "test")
