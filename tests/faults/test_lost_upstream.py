"""Webhooks lost upstream (an endpoint down past the providers' retries) are made whole by the crons alone.

Stripe events that Stripe lists but the API never received, and Clerk changes
that only Clerk holds; then a worker is started with the backfill and both
reconciliations every minute, as an operator repairing an outage would set
them. After the first tick every workspace and user is right, the missed Stripe
events are in the inbox, processed, and one alert names them. The worker's
cron scheduler reads a clock the test moves (``--fake-clock-file``), so that
tick comes when the test starts the next minute instead of up to a minute later.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from app.core.resources import Resources
from app.core.settings import load_settings
from app.identity.models import AppUser, Workspace
from app.runtime import open_resources
from app.testing import read_inbox_row, stripe_event, stripe_subscription
from app.testing.clerk_stub import ClerkStub
from app.testing.fixtures import clerk_stub, clerk_stub_server, stripe_stub, stripe_stub_server
from app.testing.stripe_stub import StripeStub
from tests.factories import WorkspaceFactory, persist
from tests.processes import wait_for, worker_starter
from tests.stubs.sentry_ingest import SentryIngestStub

__all__ = ["clerk_stub", "clerk_stub_server", "stripe_stub", "stripe_stub_server"]
pytestmark = pytest.mark.slow
EVERY_MINUTE = "* * * * *"


def _gap_alerts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [event for event in events if "exception" not in event and "Webhook gap" in str(event)]


async def _state(resources: Resources) -> tuple[dict[str, int | None], set[str]]:
    async with resources.db.session() as session:
        seats = dict((await session.execute(select(Workspace.stripe_customer_id, Workspace.seat_quantity))).all())
        users = set((await session.scalars(select(AppUser.clerk_user_id))).all())
    return {str(k): v for k, v in seats.items() if k}, users


async def test_after_an_outage_the_crons_store_the_missed_stripe_events_and_reconcile_clerk(
    settings_env: dict[str, str],
    stripe_stub: StripeStub,
    clerk_stub: ClerkStub,
    sentry_stub: SentryIngestStub,
    tmp_path: Path,
) -> None:
    env = {
        **settings_env,
        "MESSAGE_QUEUE_DRIVER": "arq",
        "STRIPE_API_BASE": stripe_stub.base_url,
        "CLERK_SECRET_KEY": "sk_test_lost_upstream",
        "CLERK_API_BASE": f"{clerk_stub.base_url}/v1",
        "SENTRY_DSN": sentry_stub.dsn,
        "WEBHOOK_BACKFILL_CRON": EVERY_MINUTE,
        "BILLING_RECONCILE_CRON": EVERY_MINUTE,
        "IDENTITY_RECONCILE_CRON": EVERY_MINUTE,
    }
    resources = open_resources(load_settings(env))
    try:
        # The outage: Stripe changed two customers and sent events the API never received (older than the
        # backfill's grace); Clerk gained an organization, a user and their membership.
        missed = []
        for customer, seats in (("cus_lost_a", 7), ("cus_lost_b", 4)):
            await persist(resources.db, WorkspaceFactory.build(stripe_customer_id=customer, member_limit=3))
            stripe_stub.put_customer(customer)
            subscription = stripe_stub.put_subscription(customer, quantity=seats)
            body = stripe_subscription(customer, id=subscription["id"], quantity=seats)
            missed.append(
                stripe_stub.put_event(
                    stripe_event("customer.subscription.updated", body, created=int(time.time()) - 300)
                )
            )
        clerk_stub.put_organization("org_lost", name="Lost and found", slug="lost")
        clerk_stub.put_user("user_lost", email="lost@example.org")
        clerk_stub.put_membership("orgmem_lost", organization="org_lost", user="user_lost")

        clock = tmp_path / "clock"
        now = datetime.now(UTC)
        clock.write_text(now.isoformat())
        async with worker_starter(env) as start:
            await start("--fake-clock-file", str(clock), wait="Cron scheduler started")
            # The next minute begins: the crons tick, as every minute (their first tick: none runs at the start).
            clock.write_text((now.replace(second=0, microsecond=0) + timedelta(minutes=1, seconds=1)).isoformat())

            async def whole() -> bool:
                seats, users = await _state(resources)
                return seats == {"cus_lost_a": 7, "cus_lost_b": 4} and "user_lost" in users

            await wait_for(whole, 60, "every workspace and user to be right")
            for event in missed:
                await wait_for(partial(_processed, resources, str(event["id"])), 60, f"{event['id']} processed")
            alerts = _gap_alerts(sentry_stub.wait_for(lambda items: bool(_gap_alerts(items)), 30))
        async with resources.db.session() as session:
            name = await session.scalar(select(Workspace.name).where(Workspace.clerk_org_id == "org_lost"))
    finally:
        await resources.close()
    assert name == "Lost and found"
    assert len(alerts) == 1, alerts  # one alert naming both events, not one per event
    assert "2 Stripe events" in str(alerts[0])


async def _processed(resources: Resources, event_id: str) -> bool:
    row = await read_inbox_row(resources.db, "stripe", event_id)
    return row is not None and row.processed
