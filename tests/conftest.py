"""Test fixtures: a real Postgres database per test session, a Redis namespace per test.

The servers come from ``TEST_DATABASE_URL`` / ``TEST_REDIS_URL`` (``make test``
sets them: local servers when they answer, else embedded ones). A run migrates
one template database, once, when its first test needs a database; each pytest
process (xdist worker) then gets a clone of its own (``CREATE DATABASE ...
TEMPLATE``), so runs in parallel never share rows. Each test starts on emptied
tables and its own Redis key prefix. The run drops its template at its end.
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


async def ensure_template(base_url: str, template: str) -> bool:
    """Create and migrate database ``template`` unless it exists; True if this call made it.

    The processes of a run (xdist workers) may ask at once: an advisory lock lets one migrate while the others
    wait, then they all find it made.
    """
    connection = await asyncpg.connect(_admin_dsn(base_url))
    try:
        await connection.execute("SELECT pg_advisory_lock(hashtext($1))", template)
        try:
            if await connection.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", template):
                return False
            await connection.execute(f'CREATE DATABASE "{template}"')
            try:
                await asyncio.to_thread(_migrate, make_url(base_url).set(database=template).render_as_string(False))
            except BaseException:
                await connection.execute(f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)')
                raise
            return True
        finally:
            await connection.execute("SELECT pg_advisory_unlock(hashtext($1))", template)
    finally:
        await connection.close()


async def clone_database(base_url: str, template: str, name: str) -> str:
    """A new database ``name``, a copy of ``template`` (which no session may be connected to); its URL."""
    connection = await asyncpg.connect(_admin_dsn(base_url))
    try:
        await connection.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    finally:
        await connection.close()
    return make_url(base_url).set(database=name).render_as_string(hide_password=False)


TEMPLATE_KEY = "test_template_database"
TEMPLATE_MADE_KEY = "test_template_made"
_template = pytest.StashKey[str]()
_template_made = pytest.StashKey[bool]()


def template_name(config: pytest.Config) -> str:
    """This run's template database: named by the controller (or the only process), told to the xdist workers."""
    workerinput = getattr(config, "workerinput", None)
    return str(workerinput[TEMPLATE_KEY] if workerinput else config.stash[_template])


@pytest.fixture(scope="session")
def database_url(base_database_url: str, pytestconfig: pytest.Config) -> Iterator[str]:
    """A migrated database of this test process (a clone of the run's template), dropped at the end."""
    template = template_name(pytestconfig)
    if asyncio.run(ensure_template(base_database_url, template)):
        _report_template_made(pytestconfig)
    name = f"test_{uuid.uuid4().hex[:12]}"
    url = asyncio.run(clone_database(base_database_url, template, name))
    yield url
    asyncio.run(drop_database(base_database_url, name))


def _report_template_made(config: pytest.Config) -> None:
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[TEMPLATE_MADE_KEY] = True  # the controller drops it at the end of the run
    else:
        config.stash[_template_made] = True


@pytest.fixture(scope="session")
def webhook_secrets() -> dict[str, str]:
    return {"stripe": generate_whsec(), "stripe_old": generate_whsec(), "clerk": generate_whsec()}


def new_redis_namespace() -> str:
    return f"t{uuid.uuid4().hex[:10]}:"


@pytest.fixture
def redis_namespace() -> str:
    return new_redis_namespace()


def app_env(database_url: str, redis_url: str, redis_namespace: str, webhook_secrets: dict[str, str]) -> dict[str, str]:
    """The environment of the app under test (``settings_env``'s, or a server's shared by a process's tests)."""
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
def settings_env(
    database_url: str, redis_url: str, redis_namespace: str, webhook_secrets: dict[str, str]
) -> dict[str, str]:
    """The environment of the app under test; tests change entries, then build ``settings``."""
    return app_env(database_url, redis_url, redis_namespace, webhook_secrets)


@pytest.fixture
def settings(settings_env: dict[str, str]) -> Settings:
    return load_settings(settings_env)


_EMPTY_CHECKS: dict[str, str] = {}
_OWNED_SEQUENCES = """
SELECT t.relname, s.relname FROM pg_depend d
JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
JOIN pg_class t ON t.oid = d.refobjid AND pg_table_is_visible(t.oid)
WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')
  AND t.relname = ANY($1::text[])
"""


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


async def _empty_check(connection: Any, url: str) -> str:
    """A query naming each table of ``metadata`` that has a row or a used id sequence (built once per database)."""
    if url not in _EMPTY_CHECKS:
        all_models()  # every module's tables are in ``metadata``
        tables = [table.name for table in metadata.sorted_tables]
        sequences: dict[str, list[str]] = {}
        for table, sequence in await connection.fetch(_OWNED_SEQUENCES, tables):
            sequences.setdefault(table, []).append(sequence)
        checks = []
        for table in tables:
            used = " OR ".join(
                f"EXISTS (SELECT FROM pg_sequences WHERE schemaname = current_schema() AND sequencename = "
                f"{_literal(sequence)} AND last_value IS NOT NULL)"
                for sequence in sequences.get(table, [])
            )
            rows = f'EXISTS (SELECT FROM "{table}")'
            checks.append(f"SELECT {_literal(table)} WHERE {rows}{' OR ' + used if used else ''}")
        _EMPTY_CHECKS[url] = " UNION ALL ".join(checks)
    return _EMPTY_CHECKS[url]


async def empty_tables(url: str) -> None:
    """Every table of the listed modules emptied and its ids restarted, as ``TRUNCATE ... RESTART IDENTITY`` of
    them all does; only those a test wrote to are truncated (a truncate costs ~10 ms a table, the check ~1 ms)."""
    connection = await asyncpg.connect(_admin_dsn(url))
    try:
        used = [row[0] for row in await connection.fetch(await _empty_check(connection, url))]
        if used:
            tables = ", ".join(f'"{table}"' for table in used)
            await connection.execute(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")
    finally:
        await connection.close()


@pytest.fixture(autouse=True)
async def _clean_state(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Empty every table before a test that uses the database; drop the test's Redis keys after."""
    if "database_url" in request.fixturenames:
        await empty_tables(request.getfixturevalue("database_url"))
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


BROWSER_FIXTURE = "browser"
SLOW_SECONDS = 5.0
"""What a test marked ``slow`` without a figure is expected to take; ``slow(seconds)`` says more."""


def expected_seconds(item: pytest.Item) -> float:
    marker = item.get_closest_marker("slow")
    if marker is None:
        return 0.0
    return float(marker.args[0]) if marker.args else SLOW_SECONDS


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests that drive Chromium ``browser``; then order the modules longest test first.

    Under xdist (``make test``: ``--maxschedchunk 1``) each worker takes the next test whenever it is
    free, so the long ones start at once, side by side, instead of one of them ending the run alone.
    A module's tests stay together and in their order.
    """
    for item in items:
        if BROWSER_FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.browser)
    longest: dict[Any, float] = {}
    for item in items:
        longest[item.path] = max(longest.get(item.path, 0.0), expected_seconds(item))
    first = {path: index for index, path in enumerate(longest)}
    items.sort(key=lambda item: (-longest[item.path], first[item.path]))


def pytest_addoption(parser: Any) -> None:
    parser.addoption("--fuzz-examples", type=int, default=2500, help="requests the intake fuzz test sends")


@pytest.fixture
def fuzz_examples(request: pytest.FixtureRequest) -> int:
    return int(request.config.getoption("--fuzz-examples"))


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("APP_ENV", "test")
    config.addinivalue_line(
        "markers", "slow(seconds): as `slow`; `seconds`, for the longest tests: about how long (started first)"
    )
    config.addinivalue_line("markers", "browser: drives Chromium (given to every test using the browser fixture)")
    if not hasattr(config, "workerinput"):
        config.stash[_template] = f"test_template_{uuid.uuid4().hex[:12]}"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist: each worker clones the run's one template."""
    node.workerinput[TEMPLATE_KEY] = node.config.stash[_template]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    if getattr(node, "workeroutput", {}).get(TEMPLATE_MADE_KEY):
        node.config.stash[_template_made] = True


def pytest_unconfigure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or not config.stash.get(_template_made, False):
        return
    base_url = os.environ.get("TEST_DATABASE_URL") or DEFAULT_DATABASE_URL
    asyncio.run(drop_database(base_url, config.stash[_template]))
