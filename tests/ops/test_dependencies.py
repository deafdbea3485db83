"""Routes get their services through Litestar's DI, and a test replaces one by name, as an app's own tests would."""

from __future__ import annotations

import re

import pytest
from litestar import Litestar
from litestar.di import NamedDependency, Provide
from litestar.testing import AsyncTestClient

from app.asgi import build_app
from app.core.resources import Resources
from app.core.settings import SettingsError, load_settings
from app.ops.pipeline_state import PipelineReader, PipelineState
from app.ops.services import OpsActions
from app.webhooks.inbox import Inbox
from tests.ops.conftest import OPS_PASSWORD, seed_known_events

CSRF = re.compile(r'name="_csrf" value="([^"]+)"')


class RecordingActions(OpsActions):
    """Reopens nothing: says what it was asked."""

    asked: list[str]

    async def reopen_all(self) -> str:
        self.asked.append("reopen")
        return "Reopened nothing: a stand-in."


async def logged_in(client: AsyncTestClient[Litestar]) -> str:
    """Logs in; the session's CSRF token for the forms."""
    token = CSRF.search((await client.get("/ops")).text)
    assert token is not None
    answer = await client.post("/ops/login", data={"_csrf": token.group(1), "password": OPS_PASSWORD})
    assert answer.status_code == 200 and "Logged in." in answer.text, answer.text
    token = CSRF.search(answer.text)
    assert token is not None
    return token.group(1)


async def test_a_test_replaces_the_ops_actions_by_name(ops_env: dict[str, str], resources: Resources) -> None:
    known = await seed_known_events(resources)
    asked: list[str] = []

    def provide_recording_actions(resources: NamedDependency[Resources], inbox: NamedDependency[Inbox]) -> OpsActions:
        """Built like the real one, from the app's own dependencies (``resources``, ``inbox``)."""
        actions = RecordingActions(resources, inbox, {})
        actions.asked = asked
        return actions

    replaced = {"ops_actions": Provide(provide_recording_actions, sync_to_thread=False)}
    async with AsyncTestClient(build_app(load_settings(ops_env), dependencies=replaced)) as client:
        token = await logged_in(client)
        answer = await client.post("/ops/reopen", data={"_csrf": token})

    assert answer.status_code == 200 and "Reopened nothing: a stand-in." in answer.text
    assert asked == ["reopen"]
    set_aside = [row.id for row in await Inbox(resources.db).page(state="set_aside")]
    assert sorted(set_aside) == sorted(known.set_aside_rows)  # the real service was not asked


async def test_a_test_replaces_what_metrics_reads(settings_env: dict[str, str], resources: Resources) -> None:
    class FixedPipeline(PipelineReader):
        async def read(self) -> PipelineState:
            return PipelineState(inbox={"stripe": {"pending": 41, "failed": 0, "set_aside": 1}}, waiting={"q": 7})

    replaced = {"pipeline": Provide(lambda: FixedPipeline(resources, {}), sync_to_thread=False)}
    async with AsyncTestClient(build_app(load_settings(settings_env), dependencies=replaced)) as client:
        text = (await client.get("/metrics")).text
    assert 'webhook_inbox_events{provider="stripe",state="pending"} 41.0' in text
    assert 'queue_jobs_waiting{queue="q"} 7.0' in text


async def test_the_real_providers_serve_the_same_routes(ops_env: dict[str, str], resources: Resources) -> None:
    """No replacement: the page's services are the real ones, built by the module's providers."""
    known = await seed_known_events(resources)
    async with AsyncTestClient(build_app(load_settings(ops_env))) as client:
        token = await logged_in(client)
        answer = await client.post("/ops/reopen", data={"_csrf": token})
        missing = await client.get("/ops/events/999999")
    assert answer.status_code == 200 and "Reopened 3 webhook events." in answer.text
    assert not await Inbox(resources.db).page(state="set_aside")
    assert known.set_aside_rows and missing.status_code == 404 and "No webhook event with row id 999999" in missing.text


def test_replacing_a_dependency_nothing_provides_is_refused(settings_env: dict[str, str]) -> None:
    """A misspelt name would otherwise leave the real service in place, silently."""
    with pytest.raises(SettingsError, match="ops_action"):
        build_app(load_settings(settings_env), dependencies={"ops_action": Provide(lambda: None, sync_to_thread=False)})
