"""The page's actions answer alike: the CSRF check first, then the service, its info line, and a 303 to the page."""

from __future__ import annotations

import html
import logging
from collections.abc import Iterator

import pytest
from litestar.testing import AsyncTestClient

from app.asgi import build_app
from app.core.resources import Resources
from app.core.settings import load_settings
from app.webhooks.inbox import Inbox
from tests.ops.conftest import seed_known_events
from tests.ops.test_dependencies import logged_in


class ActionLines(logging.Handler):
    """The page's action lines, as its logger writes them (the app's logging setup replaces the root's handlers)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if ", asked by " in record.getMessage():
            self.lines.append(record.getMessage())


@pytest.fixture
def action_lines() -> Iterator[ActionLines]:
    logger = logging.getLogger("app.ops.controllers")
    handler, level = ActionLines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


async def test_every_action_without_the_csrf_token_is_refused_and_does_nothing(
    ops_env: dict[str, str], resources: Resources, action_lines: ActionLines
) -> None:
    known = await seed_known_events(resources)
    row = known.failed_row
    paths = [
        f"/ops/events/{row}/retry",
        f"/ops/events/{row}/replay",
        f"/ops/events/{row}/preview",
        "/ops/reopen",
        "/ops/crons/WebhookRecoveryCronJob/run",
        "/ops/backfill",
        "/ops/upstreams/stripe/pause",
        "/ops/upstreams/stripe/resume",
    ]
    async with AsyncTestClient(build_app(load_settings(ops_env))) as client:
        await logged_in(client)
        answers = {path: await client.post(path, data={"_csrf": "forged", "hours": "1"}) for path in paths}

    for path, answer in answers.items():
        assert answer.status_code == 403, path
        assert "CSRF token is missing or wrong" in answer.text, path
    assert action_lines.lines == []
    failed = await Inbox(resources.db).get(row)
    assert failed is not None and failed.state == "failed"
    assert sorted(row.id for row in await Inbox(resources.db).page(state="set_aside")) == sorted(known.set_aside_rows)


async def test_an_action_answers_303_to_its_page_with_its_message_and_one_line_naming_it(
    ops_env: dict[str, str], resources: Resources, action_lines: ActionLines
) -> None:
    known = await seed_known_events(resources)
    row = known.failed_row
    async with AsyncTestClient(build_app(load_settings(ops_env))) as client:
        token = await logged_in(client)
        answer = await client.post(f"/ops/events/{row}/retry", data={"_csrf": token}, follow_redirects=False)
        page = await client.get(answer.headers["location"])
        again = await client.get(answer.headers["location"])

    assert answer.status_code == 303 and answer.headers["location"] == f"/ops/events/{row}"
    assert f"Queued stripe event evt_ops_stripe_3 (row {row})." in page.text
    assert "Queued stripe event" not in again.text  # the message is shown once
    assert action_lines.lines == [f"Operations page: retry webhook event row {row}, asked by testclient."]


async def test_an_action_on_a_target_nobody_knows_is_404_and_logs_no_line(
    ops_env: dict[str, str], resources: Resources, action_lines: ActionLines
) -> None:
    """The log names only real rows, crons and upstreams, never whatever a path segment held."""
    await seed_known_events(resources)
    missing = {
        "/ops/events/999999/retry": "No webhook event with row id 999999",
        "/ops/events/999999/replay": "No webhook event with row id 999999",
        "/ops/events/999999/preview": "No webhook event with row id 999999",
        "/ops/events/1/rewind": "No event action 'rewind': retry or replay.",
        "/ops/crons/NoSuchCron/run": "No cron named 'NoSuchCron'.",
        "/ops/upstreams/stirpe/resume": "the known upstreams are: clerk, email, stripe",
        "/ops/upstreams/stripe/restart": "No upstream action 'restart': pause or resume.",
    }
    async with AsyncTestClient(build_app(load_settings(ops_env))) as client:
        token = await logged_in(client)
        answers = {path: await client.post(path, data={"_csrf": token}) for path in missing}

    for path, answer in answers.items():
        assert answer.status_code == 404, path
        assert missing[path] in html.unescape(answer.text), path
    assert action_lines.lines == []
