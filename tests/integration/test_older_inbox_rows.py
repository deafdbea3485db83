"""Rows stored before 0005 get, from 0010, the keys the intake stores today; a Stripe one is then synced as any."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg

from app.billing import module as billing
from app.core.resources import Resources
from app.core.settings import load_settings
from app.identity import module as identity
from app.identity.models import Workspace
from app.runtime import all_modules, open_resources
from app.testing import clerk_event, stripe_event, stripe_object, stripe_subscription
from app.testing.fixtures import stripe_stub, stripe_stub_server
from app.testing.stripe_stub import StripeStub
from app.webhooks.handlers import EventKeys, event_keys
from app.webhooks.inbox import Inbox
from app.webhooks.processing import process_event
from tests.conftest import _admin_dsn, _migrate
from tests.factories import WorkspaceFactory, persist

__all__ = ["stripe_stub", "stripe_stub_server"]

MANY = 2_345
"""Rows of one kind: the migration reads them in batches of 1,000."""

# As 0004 left webhook_event: no tenant_key, no sync_subject.
_INSERT_AT_0004 = """
INSERT INTO webhook_event (provider, event_id, type, payload, processed_at)
VALUES ($1, $2, $3, $4::jsonb, CASE WHEN $5 THEN now() END)
RETURNING id
"""


def older_rows() -> dict[str, tuple[str, dict[str, Any], bool]]:
    """Event id -> (provider, body, processed), as an intake before 0005 stored them."""
    subscription = stripe_event("customer.subscription.updated", stripe_subscription("cus_old", id="sub_old"))
    invoice = stripe_event("invoice.paid", stripe_object("invoice", customer="cus_paid"))
    dispute = stripe_event("charge.dispute.created", stripe_object("dispute", charge="ch_disputed"))
    nameless = stripe_event("customer.subscription.updated", {"object": "subscription"})  # names no customer
    member = clerk_event("organizationMembership.created")
    user = clerk_event("user.created")
    return {
        "evt_subscription": ("stripe", subscription, False),
        "evt_invoice": ("stripe", invoice, True),  # processed: the workspace's timeline lists it too
        "evt_dispute": ("stripe", dispute, False),
        "evt_nameless": ("stripe", nameless, False),
        "msg_member": ("clerk", member, False),
        "msg_user": ("clerk", user, True),
        "evt_other": ("acme", {"id": "evt_other", "data": {"id": "thing_1"}}, False),  # no module handles it
    }


async def store_at_0004(url: str, rows: dict[str, tuple[str, dict[str, Any], bool]]) -> dict[str, int]:
    connection = await asyncpg.connect(_admin_dsn(url))
    try:
        return {
            event_id: await connection.fetchval(
                _INSERT_AT_0004, provider, event_id, body.get("type", "thing.happened"), json.dumps(body), processed
            )
            for event_id, (provider, body, processed) in rows.items()
        }
    finally:
        await connection.close()


async def store_many_at_0004(url: str, how_many: int) -> None:
    """Clerk user events, more than the migration reads in one batch."""
    bodies = [clerk_event("user.updated", id=f"user_{n}") for n in range(how_many)]
    connection = await asyncpg.connect(_admin_dsn(url))
    try:
        await connection.executemany(
            _INSERT_AT_0004,
            [("clerk", f"msg_many_{n}", body["type"], json.dumps(body), True) for n, body in enumerate(bodies)],
        )
    finally:
        await connection.close()


async def stored_keys(url: str) -> dict[str, EventKeys]:
    connection = await asyncpg.connect(_admin_dsn(url))
    try:
        rows = await connection.fetch("SELECT event_id, tenant_key, sync_subject FROM webhook_event")
    finally:
        await connection.close()
    return {row["event_id"]: EventKeys(row["tenant_key"], row["sync_subject"]) for row in rows}


def test_rows_stored_before_0005_get_the_keys_the_intake_gives_them(empty_database: str) -> None:
    _migrate(empty_database, "0004")
    rows = older_rows()
    asyncio.run(store_at_0004(empty_database, rows))
    asyncio.run(store_many_at_0004(empty_database, MANY))
    _migrate(empty_database, "0009")
    assert set(asyncio.run(stored_keys(empty_database)).values()) == {EventKeys()}  # 0005 added empty columns

    _migrate(empty_database)
    keys = asyncio.run(stored_keys(empty_database))
    assert all(keys[f"msg_many_{n}"] == EventKeys(f"user:user_{n}") for n in range(MANY))
    for event_id, (provider, body, _) in rows.items():
        assert keys[event_id] == event_keys(all_modules(), provider)(body.get("type", ""), body), event_id
    assert keys["evt_subscription"] == EventKeys("cus_old", "customer:cus_old")
    assert keys["evt_invoice"] == EventKeys("cus_paid", "customer:cus_paid")
    assert keys["evt_dispute"].tenant == "ch_disputed"
    assert keys["evt_dispute"].subject == f"dispute:{rows['evt_dispute'][1]['data']['object']['id']}"
    assert keys["msg_member"].tenant is not None and keys["msg_member"].tenant.startswith("org:")
    assert keys["msg_user"] == EventKeys(f"user:{rows['msg_user'][1]['data']['id']}", None)
    assert keys["evt_nameless"] == keys["evt_other"] == EventKeys()


def test_a_stripe_row_stored_before_0005_is_synced_after_the_upgrade(
    empty_database: str, settings_env: dict[str, str], stripe_stub: StripeStub
) -> None:
    """Its job asks for the sync of its customer, as for a row the intake stores today (no compatibility path)."""
    _migrate(empty_database, "0004")
    subscription = stripe_event("customer.subscription.updated", stripe_subscription("cus_old", id="sub_old"))
    row_ids = asyncio.run(store_at_0004(empty_database, {"evt_old": ("stripe", subscription, False)}))
    _migrate(empty_database)
    stripe_stub.put_customer("cus_old")
    stripe_stub.put_subscription("cus_old", id="sub_old", quantity=4)
    env = {"DATABASE_URL": empty_database, "STRIPE_API_BASE": stripe_stub.base_url, "MESSAGE_QUEUE_DRIVER": "sync"}
    settings = load_settings({**settings_env, **env})

    async def process() -> tuple[Workspace | None, Any]:
        resources: Resources = open_resources(settings, [billing.MODULE, identity.MODULE])
        try:
            workspace = await persist(resources.db, WorkspaceFactory.build(stripe_customer_id="cus_old"))
            await process_event(resources, row_ids["evt_old"], "stripe")  # the sync runs inline (sync driver)
            async with resources.db.session() as session:
                synced = await session.get(Workspace, workspace.id)
            return synced, await Inbox(resources.db).get(row_ids["evt_old"])
        finally:
            await resources.close()

    workspace, row = asyncio.run(process())
    assert row is not None and row.processed_at is not None and row.abandoned_at is None
    assert (row.attempts, row.last_error) == (1, None)
    assert workspace is not None and (workspace.subscription_id, workspace.seat_quantity) == ("sub_old", 4)
    assert stripe_stub.requests == [("GET", "/v1/customers/cus_old")]
