"""A worker process loads no Litestar: it serves no request, and Litestar (its app, its OpenAPI document,
advanced-alchemy's plugin) was a third of a worker's start-up.

The production entry point (``python -m app.worker``) runs in a real process
and processes a Stripe event (a sync reading the Stripe stub) and a Clerk
event, so the modules its handlers import on first use count too; once it has
stopped, the process lists the Litestar modules it holds.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from asyncio.subprocess import PIPE
from pathlib import Path

import pytest
from sqlalchemy import select

from app.core.settings import load_settings
from app.identity.models import AppUser
from app.runtime import open_resources
from app.testing import (
    clerk_event,
    signed_clerk_delivery,
    signed_stripe_delivery,
    stripe_event,
    stripe_subscription,
)
from app.testing.fixtures import stripe_stub, stripe_stub_server
from app.testing.processes import child_env
from app.testing.stripe_stub import StripeStub
from app.webhooks.inbox import Inbox
from app.webhooks.jobs import queue_processing
from tests.billing.conftest import store, workspace_row
from tests.factories import WorkspaceFactory, persist
from tests.processes import ROOT, wait_for

__all__ = ["stripe_stub", "stripe_stub_server"]

pytestmark = pytest.mark.slow

# The worker's own entry point, run as ``python -m app.worker`` runs it; once it exits, the Litestar modules
# it holds (a module refused while advanced-alchemy loaded is None there: not loaded).
ENTRY_THEN_REPORT = """
import json, runpy, sys
try:
    runpy.run_module("app.worker", run_name="__main__", alter_sys=True)
finally:
    held = sorted(name for name, module in sys.modules.items() if module and name.split(".")[0] == "litestar")
    print("litestar modules: " + json.dumps(held), flush=True)
"""


async def test_a_worker_processes_stripe_and_clerk_events_without_loading_litestar(
    settings_env: dict[str, str], stripe_stub: StripeStub, webhook_secrets: dict[str, str], tmp_path: Path
) -> None:
    env = {**settings_env, "STRIPE_API_BASE": stripe_stub.base_url, "WORKER_METRICS_PORT": "0"}
    resources = open_resources(load_settings(env))
    try:
        stripe_stub.put_customer("cus_imports")
        stripe_stub.put_subscription("cus_imports", id="sub_imports", quantity=3)
        workspace = await persist(resources.db, WorkspaceFactory.build(stripe_customer_id="cus_imports"))
        subscription = stripe_subscription("cus_imports", id="sub_imports", quantity=1)
        stripe = signed_stripe_delivery(
            stripe_event("customer.subscription.updated", subscription), webhook_secrets["stripe"]
        )
        clerk = signed_clerk_delivery(clerk_event("user.created", id="user_imports"), webhook_secrets["clerk"])
        rows = {"stripe": await store(resources, stripe), "clerk": await store(resources, clerk, "clerk")}
        for provider, row_id in rows.items():
            assert await queue_processing(resources.queue, provider, row_id)

        log = tmp_path / "worker.log"
        with log.open("wb") as errors:
            worker = await asyncio.create_subprocess_exec(
                sys.executable, "-c", ENTRY_THEN_REPORT, cwd=ROOT, env=child_env(env), stdout=PIPE, stderr=errors
            )
        try:

            async def done() -> bool:
                records = [await Inbox(resources.db).get(row_id) for row_id in rows.values()]
                synced = (await workspace_row(resources, workspace.id)).seat_quantity == 3
                return synced and all(record is not None and record.processed_at for record in records)

            await wait_for(done, 60, "the worker to process both events and sync the workspace from the stub")
        finally:
            worker.send_signal(signal.SIGTERM)
            output, _ = await asyncio.wait_for(worker.communicate(), 60)
        async with resources.db.session() as session:
            assert list(await session.scalars(select(AppUser.clerk_user_id))) == ["user_imports"]
    finally:
        await resources.close()
    assert worker.returncode == 0, log.read_text()[-3000:]
    report = next(line for line in output.decode().splitlines() if line.startswith("litestar modules: "))
    assert json.loads(report.removeprefix("litestar modules: ")) == []
