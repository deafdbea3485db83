"""A flood of one provider's or one tenant's events holds up no other's: the order the database records.

The production worker (every module of ``app/runtime.py``) on its own queues:
each provider's events on a queue of their own, the Stripe syncs on theirs,
and within a provider's queue each tenant (a Clerk organization, a Stripe
customer) takes its turn.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from app.core.resources import Resources
from app.runtime import WORKER_MODULES
from app.testing import clerk_event, stripe_event, stripe_subscription
from app.testing.fixtures import stripe_stub, stripe_stub_server
from app.testing.stripe_stub import StripeStub
from app.webhooks.handlers import event_keys
from app.webhooks.inbox import Inbox
from app.webhooks.jobs import deduplication_id, queue_processing_many
from app.webhooks.maintenance import recover
from app.webhooks.payload import normalized_for_inbox
from tests.processes import wait_for, worker_starter

__all__ = ["stripe_stub", "stripe_stub_server"]
pytestmark = pytest.mark.slow

# In turns, the others' events come within the first few dozen; first come first served, after all 500 of these.
FLOOD = 500


def membership(organization: str, n: int) -> dict[str, Any]:
    """An ``organizationMembership.created`` of ``organization``: a new member, one of a bulk import."""
    event = clerk_event("organizationMembership.created", id=f"orgmem_{organization}_{n}")
    event["data"]["organization"] = {**event["data"]["organization"], "id": organization}
    event["data"]["public_user_data"] = {**event["data"]["public_user_data"], "user_id": f"user_{organization}_{n}"}
    return event


async def store_and_queue(resources: Resources, provider: str, events: Sequence[dict[str, Any]]) -> list[int]:
    """As the intake stores and queues them (keys decided by the module that handles them), 500 a call."""
    keys_of = event_keys(WORKER_MODULES, provider)
    rows = []
    for event in events:
        event_id = str(event.get("id") or f"msg_{event['data']['id']}")
        text_ = normalized_for_inbox(event)
        keys = keys_of(event["type"], event)
        stored = await Inbox(resources.db).store(
            provider, event_id, event["type"], text_, tenant_key=keys.tenant, sync_subject=keys.subject
        )
        rows.append((provider, stored.row_id, keys.tenant, None))
    for start in range(0, len(rows), 500):
        await queue_processing_many(resources.queue, rows[start : start + 500])
    return [row_id for _, row_id, _, _ in rows]


async def processed_order(resources: Resources) -> list[int]:
    async with resources.db.session() as session:
        query = text("SELECT id FROM webhook_event WHERE processed_at IS NOT NULL ORDER BY processed_at, id")
        return [row[0] for row in await session.execute(query)]


@pytest.fixture
async def start_worker(settings_env: dict[str, str], stripe_stub: StripeStub) -> AsyncIterator[Callable[..., Any]]:
    env = {**settings_env, "STRIPE_API_BASE": stripe_stub.base_url}
    async with worker_starter(env) as start:
        yield start


async def test_a_stripe_event_and_another_organizations_events_are_not_held_up_by_a_bulk_import(
    resources: Resources, start_worker: Callable[..., Any]
) -> None:
    """One worker; 500 membership events of one organization queued first, then a Stripe event and two events
    of another organization: the Stripe event is processed before a tenth of the flood, the other
    organization's before a quarter of it, and the flood is processed whole."""
    flood = await store_and_queue(resources, "clerk", [membership("org_flood", n) for n in range(FLOOD)])
    (stripe,) = await store_and_queue(
        resources, "stripe", [stripe_event("customer.subscription.updated", stripe_subscription("cus_unlinked"))]
    )
    other = await store_and_queue(
        resources,
        "clerk",
        [clerk_event("organization.updated", id="org_other"), membership("org_other", 1)],
    )
    await start_worker()

    async def all_processed() -> bool:
        return len(await processed_order(resources)) == FLOOD + 3

    await wait_for(all_processed, 120, "every event to be processed")
    order = await processed_order(resources)
    flooded = set(flood)

    def flood_before(row_id: int) -> int:
        return sum(row in flooded for row in order[: order.index(row_id)])

    assert flood_before(stripe) < FLOOD // 10
    assert max(flood_before(row_id) for row_id in other) < FLOOD // 4


async def test_recovery_queues_a_stuck_event_with_its_tenants_turn_not_behind_a_flood(resources: Resources) -> None:
    """No worker runs: a flood of one organization waits, and another organization's event, stuck for an hour
    (its job lost), is queued again by the recovery cron: at the head of the queue, not behind the 500."""
    await store_and_queue(resources, "clerk", [membership("org_flood", n) for n in range(500)])
    event = membership("org_stuck", 1)
    keys = event_keys(WORKER_MODULES, "clerk")(event["type"], event)
    text_ = normalized_for_inbox(event)
    stuck = await Inbox(resources.db).store(
        "clerk", "msg_stuck", event["type"], text_, tenant_key=keys.tenant, sync_subject=None
    )
    async with resources.db.session() as session:
        await session.execute(
            text("UPDATE webhook_event SET received_at = now() - interval '1 hour' WHERE id = :id"),
            {"id": stuck.row_id},
        )
        await session.commit()

    report = await recover(resources, now=datetime.now(UTC) + timedelta(seconds=1))

    assert report.requeued == 1  # the flood is younger than WEBHOOK_RECOVERY_AFTER_SECONDS: left alone
    queue = f"{resources.settings.redis_namespace}webhook-clerk-queue"
    rank = await resources.redis.zrank(queue, f"{resources.settings.redis_namespace}{deduplication_id(stuck.row_id)}")
    assert rank is not None and rank <= 1  # next to the job served first, ahead of 499 of the flood
