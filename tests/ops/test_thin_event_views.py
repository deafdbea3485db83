"""A Stripe thin event names no object of its own, only the one it is about: operators see that related object in
`webhooks list` and on the event's page of /ops."""

from __future__ import annotations

import json
import subprocess
import sys

from litestar.testing import AsyncTestClient

from app.asgi import build_app
from app.core.resources import Resources
from app.core.settings import load_settings
from app.testing import stripe_event, stripe_subscription, stripe_thin_event
from app.testing.processes import child_env
from app.webhooks.inbox import Inbox
from tests.ops.conftest import OPS_PASSWORD, OpsClient
from tests.processes import ROOT


def webhooks_list(env: dict[str, str]) -> str:
    command = [sys.executable, "-m", "litestar", "--app", "app.asgi:create_app", "webhooks", "list"]
    listed = subprocess.run(command, cwd=ROOT, env=child_env(env), capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    return listed.stdout


async def test_a_thin_events_related_object_is_listed_and_shown_on_its_page(
    settings_env: dict[str, str], resources: Resources
) -> None:
    inbox = Inbox(resources.db)
    thin = stripe_thin_event("v1.customer.subscription.updated", "sub_shown")
    snapshot = stripe_event("customer.subscription.updated", stripe_subscription("cus_shown"))
    stored = {
        event["id"]: await inbox.store("stripe", event["id"], event["type"], json.dumps(event), tenant_key="sub_shown")
        for event in (thin, snapshot)
    }

    listed = webhooks_list(settings_env)
    settings = load_settings({**settings_env, "OPS_PASSWORD": OPS_PASSWORD})
    async with AsyncTestClient(build_app(settings)) as client:
        ops = OpsClient(client)
        assert (await ops.log_in()).status_code in (200, 303)
        thin_page = (await client.get(f"/ops/events/{stored[thin['id']].row_id}")).text
        snapshot_page = (await client.get(f"/ops/events/{stored[snapshot['id']].row_id}")).text

    lines = listed.splitlines()
    row = next(n for n, line in enumerate(lines) if thin["id"][:34] in line)
    assert lines[row + 1].strip() == "related object: subscription sub_shown"
    assert sum("related object:" in line for line in lines) == 1  # the snapshot event carries its object itself
    assert '<dd id="related-object" class="id whole">subscription sub_shown</dd>' in thin_page
    assert 'id="related-object"' not in snapshot_page
