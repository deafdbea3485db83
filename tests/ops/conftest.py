"""Fixtures of the operations tests: a real API process, a real headless Chromium, known inbox rows.

The API process (``ops_api``) is started once per test process and shared by its tests: its state is
in Postgres and Redis, and each test starts with both emptied; its Redis prefix is then the test's
(``redis_namespace``), and ``api_log`` reads what it logged during the test.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.async_api import Browser, BrowserContext, Page, Response, async_playwright
from sqlalchemy import text

from app.core.resources import Resources
from app.webhooks.models import WebhookEvent
from tests.conftest import app_env, new_redis_namespace
from tests.processes import logged_api_process
from tests.webhooks.worker_handlers import CREATE_TABLE

OPS_PASSWORD = "ops-test-password-7291"
PHONE = {"width": 390, "height": 844}
# No first-run work, no update checks, no GPU: the browser starts in about a second on a CI machine.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking"]


def chromium_path() -> str:
    path = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail(
            "The operations page is tested in Debian's Chromium, which is not installed: run `make browser` "
            "(or set CHROMIUM_PATH to a Chromium binary).",
            pytrace=False,
        )
    return path


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        yield launched
        await launched.close()


@pytest.fixture
def ops_env(settings_env: dict[str, str]) -> dict[str, str]:
    return {**settings_env, "OPS_PASSWORD": OPS_PASSWORD}


@dataclass(frozen=True)
class SharedApi:
    base_url: str
    redis_namespace: str
    log: Path


@pytest.fixture(scope="session")
def ops_api_server(
    database_url: str, redis_url: str, webhook_secrets: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SharedApi]:
    """The API with the operations page, as ``ops_env`` configures it, started when a test first needs it."""
    namespace = f"tops{uuid.uuid4().hex[:8]}:"
    env = {**app_env(database_url, redis_url, namespace, webhook_secrets), "OPS_PASSWORD": OPS_PASSWORD}
    log = tmp_path_factory.mktemp("ops-api") / "api.log"
    with logged_api_process(env, log) as base_url:
        yield SharedApi(base_url, namespace, log)


@pytest.fixture
def redis_namespace(request: pytest.FixtureRequest) -> str:
    """A test of the shared API uses its Redis prefix (the test's keys are dropped after it all the same)."""
    if "ops_api" in request.fixturenames:
        server: SharedApi = request.getfixturevalue("ops_api_server")
        return server.redis_namespace
    return new_redis_namespace()


@pytest.fixture
def ops_api(ops_api_server: SharedApi, redis_namespace: str, tmp_path: Path) -> Iterator[str]:
    """The API, with the operations page, in its own process (this test process's, shared); ``api_log(tmp_path)``
    is what it logs during the test. A test that needs the API configured otherwise starts its own
    (``logged_api_process``). ``redis_namespace`` (the API's): the test's Redis keys are dropped after it."""
    assert redis_namespace == ops_api_server.redis_namespace
    try:
        alive = httpx.get(f"{ops_api_server.base_url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        alive = False
    if not alive:
        tail = ops_api_server.log.read_text(errors="replace")[-3000:]
        pytest.fail(f"the operations tests' API process no longer answers; its log ends with:\n{tail}")
    # This test's part of the log (by file: the test modules import this one under another name than pytest).
    (tmp_path / "api.log").symlink_to(ops_api_server.log)
    (tmp_path / "api.log.start").write_text(str(ops_api_server.log.stat().st_size))
    yield ops_api_server.base_url


async def screenshot(page: Page, name: str, tmp_path: Path, *, full_page: bool = True) -> Path:
    """A PNG of the whole page (or of the screen): into ``OPS_SCREENSHOT_DIR`` when set (``make screenshots``: the
    docs' images)."""
    folder = Path(os.environ.get("OPS_SCREENSHOT_DIR") or tmp_path)
    path = folder / name
    await page.screenshot(path=str(path), full_page=full_page)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return path


def api_log(tmp_path: Path) -> str:
    """What the ``ops_api`` process (or another writing ``tmp_path / "api.log"``) has logged so far in this test."""
    start = tmp_path / "api.log.start"
    with (tmp_path / "api.log").open("rb") as file:
        file.seek(int(start.read_text()) if start.exists() else 0)
        return file.read().decode(errors="replace")


@dataclass
class OpsPage:
    """One browser tab on the operations page; every request the page makes is kept in ``requests``."""

    page: Page
    context: BrowserContext
    base_url: str
    requests: list[str] = field(default_factory=list)

    async def open(self, path: str = "/ops") -> Response:
        response = await self.page.goto(self.base_url + path)
        assert response is not None
        return response

    async def submit(self, button: str, *, form: str = "main") -> Response:
        """Click a form's submit button and wait for the page it answers with."""
        async with self.page.expect_navigation() as navigation:
            await self.page.locator(form).get_by_role("button", name=button).first.click()
        response = await navigation.value
        assert response is not None
        return response

    async def log_in(self, password: str = OPS_PASSWORD) -> Response:
        await self.open()
        await self.page.fill("#password", password)
        return await self.submit("Log in")

    async def message(self) -> str:
        return (await self.page.locator(".message").inner_text()).strip()

    def other_hosts(self) -> list[str]:
        ours = urlsplit(self.base_url).netloc
        return [url for url in self.requests if urlsplit(url).netloc != ours]


async def open_tab(browser: Browser, base_url: str, **context_options: object) -> OpsPage:
    context = await browser.new_context(**context_options)  # type: ignore[arg-type]
    page = await context.new_page()
    tab = OpsPage(page, context, base_url)
    page.on("request", lambda request: tab.requests.append(request.url))
    return tab


@pytest.fixture
async def ops(browser: Browser, ops_api: str) -> AsyncIterator[OpsPage]:
    tab = await open_tab(browser, ops_api)
    yield tab
    await tab.context.close()


@pytest.fixture
async def effects_table(resources: Resources) -> Resources:
    """The table the test handlers (``tests.webhooks.worker_handlers``) record their successes in."""
    async with resources.db.session() as session:
        await session.execute(text(CREATE_TABLE))
        await session.commit()
    return resources


@dataclass(frozen=True)
class KnownEvents:
    """Inbox rows in every state, with the counts the overview must show."""

    counts: dict[str, dict[str, int]]
    failed_row: int
    set_aside_rows: list[int]


def event_row(provider: str, n: int, now: datetime | None = None, **fields: object) -> WebhookEvent:
    """An inbox row received half an hour before ``now``: pending unless ``fields`` say otherwise."""
    now = now or datetime.now(UTC)
    row = WebhookEvent(
        provider=provider,
        event_id=f"evt_ops_{provider}_{n}",
        type="customer.subscription.updated" if provider == "stripe" else "user.updated",
        payload={"id": f"evt_ops_{provider}_{n}", "type": "test"},
        received_at=now - timedelta(minutes=30),
        attempts=0,
        tenant_key=f"cus_ops_{n % 3}" if provider == "stripe" else f"org:org_ops_{n % 2}",
    )
    for name, value in fields.items():
        setattr(row, name, value)
    return row


async def seed_known_events(resources: Resources) -> KnownEvents:
    """stripe: 3 pending, 2 failed, 1 set aside, 4 processed; clerk: 1 pending, 2 set aside, 1 processed 2 days ago."""
    now = datetime.now(UTC)
    processed: dict[str, Any] = {"attempts": 1, "processed_at": now - timedelta(minutes=5)}
    set_aside: dict[str, Any] = {
        "attempts": 33,
        "abandoned_at": now - timedelta(minutes=1),
        "last_error": "RuntimeError: boom",
    }
    rows = [
        *(event_row("stripe", n) for n in range(3)),
        *(event_row("stripe", n, attempts=n - 2, last_error="StripeError: stub fault") for n in range(3, 5)),
        event_row("stripe", 5, **set_aside),
        *(event_row("stripe", n, now=now, **processed) for n in range(6, 10)),
        event_row("clerk", 0),
        *(event_row("clerk", n, **set_aside) for n in range(1, 3)),
        event_row("clerk", 3, attempts=1, processed_at=now - timedelta(days=2)),
    ]
    async with resources.db.session() as session:
        session.add_all(rows)
        await session.commit()
    counts = {
        "stripe": {"pending": 3, "failed": 2, "set_aside": 1, "processed_24h": 4},
        "clerk": {"pending": 1, "failed": 0, "set_aside": 2, "processed_24h": 0},
    }
    return KnownEvents(counts, failed_row=rows[3].id, set_aside_rows=[rows[5].id, rows[11].id, rows[12].id])


_CSRF_FIELD = re.compile(r'name="_csrf" value="([^"]+)"')


@dataclass
class OpsClient:
    """The operations page without a browser (httpx, its cookies kept): log in, then post its forms."""

    client: httpx.AsyncClient

    async def csrf(self, page: str = "/ops") -> str:
        found = _CSRF_FIELD.search((await self.client.get(page)).text)
        assert found is not None, f"no CSRF token on {page}"
        return found.group(1)

    async def log_in(self, password: str = OPS_PASSWORD) -> httpx.Response:
        token = await self.csrf()
        return await self.client.post("/ops/login", data={"_csrf": token, "password": password})

    async def post(
        self, path: str, form: dict[str, str] | None = None, *, page: str = "/ops", **headers: str
    ) -> httpx.Response:
        """Post a form of ``page`` with its token, as its button does (not following the answer's redirect)."""
        data = {"_csrf": await self.csrf(page), **(form or {})}
        return await self.client.post(path, data=data, headers=headers)


@contextlib.asynccontextmanager
async def ops_client(base_url: str) -> AsyncIterator[OpsClient]:
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        ops = OpsClient(client)
        response = await ops.log_in()
        assert response.status_code in (200, 303), response.text
        yield ops
