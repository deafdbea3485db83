"""Tenants shown to operators: the metrics, the overview's busiest tenants, and the filters of /ops and the CLI."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from litestar.testing import AsyncTestClient

from app.asgi import build_app
from app.core.resources import Resources
from app.core.settings import load_settings
from app.ops.pipeline_state import PipelineReader, worker_crons
from app.ops.services import OpsPages
from app.ops.views import EventFilters
from app.runtime import WORKER_MODULES
from app.testing.processes import child_env
from app.webhooks.inbox import Inbox
from tests.ops.conftest import OPS_PASSWORD, OpsClient, event_row
from tests.ops.test_metrics import samples, value
from tests.processes import ROOT


async def seed_tenants(resources: Resources) -> None:
    """stripe: cus_a 3 pending (the oldest 2 h old), cus_b 1 failed and 1 processed; clerk: org:x 1 pending."""
    now = datetime.now(UTC)
    rows = [
        event_row("stripe", 1, tenant_key="cus_a", received_at=now - timedelta(hours=2)),
        event_row("stripe", 2, tenant_key="cus_a"),
        event_row("stripe", 3, tenant_key="cus_a"),
        event_row("stripe", 4, tenant_key="cus_b", attempts=1, last_error="StripeError: stub fault"),
        event_row("stripe", 5, tenant_key="cus_b", attempts=1, processed_at=now),
        event_row("clerk", 1, tenant_key="org:x"),
    ]
    async with resources.db.session() as session:
        session.add_all(rows)
        await session.commit()


@pytest.fixture
async def seeded(resources: Resources) -> Resources:
    await seed_tenants(resources)
    return resources


async def test_the_metrics_count_the_tenants_waiting_and_the_oldest_events_age(
    settings_env: dict[str, str], resources: Resources
) -> None:
    await seed_tenants(resources)
    async with AsyncTestClient(build_app(load_settings(settings_env))) as client:
        found = samples((await client.get("/metrics")).text)
    assert value(found, "webhook_queue_tenants", provider="stripe") == 2
    assert value(found, "webhook_queue_tenants", provider="clerk") == 1
    assert 7200 <= value(found, "webhook_queue_oldest_seconds", provider="stripe") < 7300
    assert 1700 <= value(found, "webhook_queue_oldest_seconds", provider="clerk") < 1900  # half an hour


async def test_the_overview_lists_the_busiest_tenants_and_the_events_page_filters_by_tenant(
    resources: Resources,
) -> None:
    await seed_tenants(resources)
    inbox = Inbox(resources.db)
    pages = OpsPages(resources, inbox, PipelineReader(resources, worker_crons(WORKER_MODULES)), ["stripe", "clerk"])

    overview = await pages.overview()
    assert [(t.provider, t.tenant_key, t.unprocessed) for t in overview.tenants] == [
        ("stripe", "cus_a", 3),
        ("stripe", "cus_b", 1),
        ("clerk", "org:x", 1),
    ]
    listed = await pages.events(EventFilters.of({"tenant": "cus_b"}), None)
    assert sorted(event.event_id for event in listed) == ["evt_ops_stripe_4", "evt_ops_stripe_5"]
    assert (
        EventFilters.of({"tenant": "cus_b", "state": "failed"}).query(before=9) == "state=failed&tenant=cus_b&before=9"
    )


@pytest.mark.usefixtures("seeded")
def test_webhooks_list_takes_a_tenant(settings_env: dict[str, str]) -> None:
    command = [
        sys.executable,
        "-m",
        "litestar",
        "--app",
        "app.asgi:create_app",
        "webhooks",
        "list",
        "--tenant",
        "cus_a",
    ]
    listed = subprocess.run(command, cwd=ROOT, env=child_env(settings_env), capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split()[-1] == "TENANT"
    assert sorted(line.split()[2] for line in lines[1:-1]) == [f"evt_ops_stripe_{n}" for n in (1, 2, 3)]
    assert all(line.endswith("cus_a") for line in lines[1:-1])
    assert lines[-1] == "3 events."


@pytest.mark.usefixtures("seeded")
async def test_the_operations_page_shows_the_busiest_tenants_and_filters_events_by_tenant(
    settings_env: dict[str, str],
) -> None:
    settings = load_settings({**settings_env, "OPS_PASSWORD": OPS_PASSWORD})
    async with AsyncTestClient(build_app(settings)) as client:
        ops = OpsClient(client)
        assert (await ops.log_in()).status_code in (200, 303)
        overview = (await client.get("/ops")).text
        events = (await client.get("/ops/events?provider=stripe&tenant=cus_a")).text
        event = (await client.get("/ops/events/1")).text

    inbox = overview.split('id="inbox"', 1)[1].split("</table>", 1)[0]
    counts = re.findall(r'data-count="(\w+)">(<a href="[^"]+">)?', inbox)
    assert len(counts) == 2 * 5 and all(link for _, link in counts), counts  # every count of the overview is a link
    tenants = overview.split('id="tenants"', 1)[1].split("</table>", 1)[0]
    assert tenants.index("cus_a") < tenants.index("cus_b") < tenants.index("org:x")  # most unprocessed first
    assert "/ops/events?provider=stripe&amp;tenant=cus_a" in tenants
    rows = events.split('id="events"', 1)[1].split("</table>", 1)[0]
    assert sorted(set(re.findall(r"evt_ops_stripe_\d", rows))) == [f"evt_ops_stripe_{n}" for n in (1, 2, 3)]
    assert 'name="tenant" value="cus_a"' in events
    assert '<dd id="tenant" class="id whole">cus_a</dd>' in event
