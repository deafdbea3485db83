"""Intake: every row of docs/behaviour.md's table, asserting the answer, the inbox and the queue."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from typing import Any, cast

import asyncpg
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy.pool import QueuePool

from app.asgi import build_app
from app.core.db import driver_connection
from app.core.resources import Resources
from app.core.settings import Settings
from app.testing.deliveries import (
    clerk_event,
    signed_clerk_delivery,
    signed_stripe_delivery,
    stripe_event,
    stripe_subscription,
)
from app.webhooks.inbox import Inbox
from app.webhooks.jobs import deduplication_id
from tests.webhooks.conftest import inbox_count, inbox_rows, kill_pooled_connection


def subscription_event(event_id: str | None = None) -> dict[str, Any]:
    return stripe_event("customer.subscription.updated", stripe_subscription("cus_intake"), event_id=event_id)


async def queue_state(resources: Resources, row_id: int, queue: str = "webhook-stripe-queue") -> str:
    return await resources.queue.state(deduplication_id(row_id), queue)


async def test_signed_stripe_event_is_stored_once_and_queued(
    client: Any, resources: Resources, webhook_secrets: dict[str, str]
) -> None:
    delivery = signed_stripe_delivery(subscription_event(), webhook_secrets["stripe"])
    response = await client.post("/webhooks/stripe", content=delivery.body, headers=delivery.headers)
    assert response.status_code == 200
    assert response.json() == {"received": True}
    (row,) = await inbox_rows(resources)
    assert (row.provider, row.event_id, row.type) == ("stripe", delivery.event_id, "customer.subscription.updated")
    assert row.payload["id"] == delivery.event_id
    assert row.processed_at is None and row.attempts == 0
    assert await queue_state(resources, row.id) == "queued"


async def test_signed_clerk_event_uses_the_svix_id(
    client: Any, resources: Resources, webhook_secrets: dict[str, str]
) -> None:
    delivery = signed_clerk_delivery(clerk_event("user.created"), webhook_secrets["clerk"])
    response = await client.post("/webhooks/clerk", content=delivery.body, headers=delivery.headers)
    assert response.status_code == 200
    (row,) = await inbox_rows(resources)
    assert row.provider == "clerk"
    assert row.event_id == delivery.headers["svix-id"]
    assert await queue_state(resources, row.id, "webhook-clerk-queue") == "queued"


async def test_forged_missing_and_stale_signatures_get_400_and_store_nothing(
    client: Any, resources: Resources, webhook_secrets: dict[str, str]
) -> None:
    event = subscription_event()
    forged = signed_stripe_delivery(event, "whsec_" + "Zm9yZ2VkLXNlY3JldC1mb3JnZWQ=")
    stale = signed_stripe_delivery(event, webhook_secrets["stripe"], timestamp=int(time.time()) - 301)
    good = signed_stripe_delivery(event, webhook_secrets["stripe"])
    tampered_body = good.body.replace(b"cus_intake", b"cus_attacker")
    attempts = [
        (forged.body, forged.headers),
        (stale.body, stale.headers),
        (good.body, {"Content-Type": "application/json"}),
        (tampered_body, good.headers),
    ]
    for body, headers in attempts:
        response = await client.post("/webhooks/stripe", content=body, headers=headers)
        assert response.status_code == 400, response.text
        assert response.json()["detail"]
    assert await inbox_count(resources) == 0
    assert await resources.redis.zcard(f"{resources.settings.redis_namespace}webhook-stripe-queue") == 0


async def test_clerk_bad_signatures_get_400(client: Any, resources: Resources, webhook_secrets: dict[str, str]) -> None:
    delivery = signed_clerk_delivery(clerk_event("user.updated"), webhook_secrets["clerk"])
    no_comma = {**delivery.headers, "svix-signature": "v1garbage"}
    stale = signed_clerk_delivery(
        clerk_event("user.updated"), webhook_secrets["clerk"], timestamp=int(time.time()) - 600
    )
    missing = {k: v for k, v in delivery.headers.items() if k != "svix-timestamp"}
    for headers, body in ((no_comma, delivery.body), (stale.headers, stale.body), (missing, delivery.body)):
        response = await client.post("/webhooks/clerk", content=body, headers=headers)
        assert response.status_code == 400
    assert await inbox_count(resources) == 0


async def test_signed_body_that_is_not_a_json_object_gets_400(
    client: Any, resources: Resources, webhook_secrets: dict[str, str]
) -> None:
    from stripe import WebhookSignature

    for body in (b"[1, 2, 3]", b"not json", b'"a string"'):
        header = WebhookSignature.generate_signature_header(body.decode(), webhook_secrets["stripe"])
        response = await client.post("/webhooks/stripe", content=body, headers={"Stripe-Signature": header})
        assert response.status_code == 400
    assert await inbox_count(resources) == 0


async def test_signed_clerk_body_that_is_not_a_json_object_or_has_no_type_gets_400(
    client: Any, resources: Resources, webhook_secrets: dict[str, str]
) -> None:
    from svix.webhooks import Webhook

    webhook = Webhook(webhook_secrets["clerk"])
    for number, body in enumerate((b"[1, 2, 3]", b"not json", b'{"type": 5}', b'{"data": {"id": "user_1"}} trailing')):
        when = datetime.now(UTC)
        headers = {
            "svix-id": f"msg_bad_{number}",
            "svix-timestamp": str(int(when.timestamp())),
            "svix-signature": webhook.sign(f"msg_bad_{number}", when, body.decode()),
        }
        response = await client.post("/webhooks/clerk", content=body, headers=headers)
        assert response.status_code == 400, body
        assert "JSON" in response.json()["detail"] or "'type'" in response.json()["detail"]
    assert await inbox_count(resources) == 0


async def test_body_over_the_limit_gets_413(
    make_client: Any, resources: Resources, webhook_secrets: dict[str, str]
) -> None:
    client = await make_client(WEBHOOK_MAX_BODY_BYTES="2048")
    event = subscription_event()
    event["data"]["object"]["metadata"] = {"padding": "x" * 4096}
    delivery = signed_stripe_delivery(event, webhook_secrets["stripe"])
    response = await client.post("/webhooks/stripe", content=delivery.body, headers=delivery.headers)
    assert response.status_code == 413
    assert await inbox_count(resources) == 0


async def test_switched_off_providers_answer_404(make_client: Any, webhook_secrets: dict[str, str]) -> None:
    client = await make_client(BILLING_PROVIDER="none", CLERK_WEBHOOK_SIGNING_SECRET="")
    stripe_delivery = signed_stripe_delivery(subscription_event(), webhook_secrets["stripe"])
    clerk_delivery = signed_clerk_delivery(clerk_event("user.created"), webhook_secrets["clerk"])
    assert (
        await client.post("/webhooks/stripe", content=stripe_delivery.body, headers=stripe_delivery.headers)
    ).status_code == 404
    assert (
        await client.post("/webhooks/clerk", content=clerk_delivery.body, headers=clerk_delivery.headers)
    ).status_code == 404
    assert (await client.post("/webhooks/unknown", content=b"{}")).status_code == 404


async def test_unhandled_type_is_acknowledged_and_dropped(
    client: Any, resources: Resources, webhook_secrets: dict[str, str]
) -> None:
    delivery = signed_stripe_delivery(
        stripe_event("payout.paid", {"id": "po_1", "object": "payout"}), webhook_secrets["stripe"]
    )
    response = await client.post("/webhooks/stripe", content=delivery.body, headers=delivery.headers)
    assert response.status_code == 200
    assert response.json() == {"received": True}
    assert await inbox_count(resources) == 0


async def test_both_rotated_stripe_secrets_verify(
    make_client: Any, resources: Resources, webhook_secrets: dict[str, str]
) -> None:
    client = await make_client(STRIPE_WEBHOOK_SECRET=f"{webhook_secrets['stripe_old']},{webhook_secrets['stripe']}")
    for secret in (webhook_secrets["stripe_old"], webhook_secrets["stripe"]):
        delivery = signed_stripe_delivery(subscription_event(), secret)
        response = await client.post("/webhooks/stripe", content=delivery.body, headers=delivery.headers)
        assert response.status_code == 200
    assert await inbox_count(resources) == 2


async def test_redelivery_stores_one_row_and_requeues_a_lost_job(
    client: Any, resources: Resources, webhook_secrets: dict[str, str]
) -> None:
    delivery = signed_stripe_delivery(subscription_event(), webhook_secrets["stripe"])
    await client.post("/webhooks/stripe", content=delivery.body, headers=delivery.headers)
    (row,) = await inbox_rows(resources)
    # The job is lost (e.g. Redis lost it): a redelivery queues it again.
    namespace = resources.settings.redis_namespace
    await resources.redis.delete(f"{namespace}webhook-stripe-queue", f"arq:job:{namespace}{deduplication_id(row.id)}")
    assert await queue_state(resources, row.id) == "absent"
    again = signed_stripe_delivery(subscription_event(delivery.event_id), webhook_secrets["stripe"])
    assert (await client.post("/webhooks/stripe", content=again.body, headers=again.headers)).status_code == 200
    assert await inbox_count(resources) == 1
    assert await queue_state(resources, row.id) == "queued"


async def test_fifty_concurrent_deliveries_make_one_row_and_one_job(
    client: Any, resources: Resources, webhook_secrets: dict[str, str]
) -> None:
    delivery = signed_stripe_delivery(subscription_event(), webhook_secrets["stripe"])
    responses = await asyncio.gather(
        *(client.post("/webhooks/stripe", content=delivery.body, headers=delivery.headers) for _ in range(50))
    )
    assert {r.status_code for r in responses} == {200}
    (row,) = await inbox_rows(resources)
    assert await resources.redis.zcard(f"{resources.settings.redis_namespace}webhook-stripe-queue") == 1
    assert await queue_state(resources, row.id) == "queued"


async def test_postgres_unreachable_answers_503(make_client: Any, webhook_secrets: dict[str, str]) -> None:
    client = await make_client(DATABASE_URL="postgresql+asyncpg://postgres@127.0.0.1:1/test")
    delivery = signed_stripe_delivery(subscription_event(), webhook_secrets["stripe"])
    response = await client.post("/webhooks/stripe", content=delivery.body, headers=delivery.headers)
    assert response.status_code == 503
    assert "deliver it again" in response.json()["detail"]


async def test_a_pooled_connection_that_died_fails_one_store_then_leaves_the_pool(resources: Resources) -> None:
    """After a Postgres restart every pooled connection is dead: each may cost one 503 (the provider delivers
    again), but it must not go back to the pool and fail every later delivery that draws it."""
    await kill_pooled_connection(resources)
    body = '{"id": "evt_after_restart", "type": "customer.subscription.updated"}'
    with pytest.raises(Exception, match="closed"):
        await Inbox(resources.db).store("stripe", "evt_after_restart", "customer.subscription.updated", body)
    stored = await Inbox(resources.db).store("stripe", "evt_after_restart", "customer.subscription.updated", body)
    assert stored.outcome == "inserted"


async def test_redelivery_of_a_set_aside_event_reopens_it(
    client: Any, resources: Resources, webhook_secrets: dict[str, str]
) -> None:
    delivery = signed_stripe_delivery(subscription_event(), webhook_secrets["stripe"])
    await client.post("/webhooks/stripe", content=delivery.body, headers=delivery.headers)
    (row,) = await inbox_rows(resources)
    async with resources.db.session() as session:
        from sqlalchemy import text

        await session.execute(
            text("UPDATE webhook_event SET attempts = 40, abandoned_at = now(), last_error = 'x' WHERE id = :id"),
            {"id": row.id},
        )
        await session.commit()
    namespace = resources.settings.redis_namespace
    await resources.redis.delete(f"{namespace}webhook-stripe-queue", f"arq:job:{namespace}{deduplication_id(row.id)}")
    again = signed_stripe_delivery(subscription_event(delivery.event_id), webhook_secrets["stripe"])
    assert (await client.post("/webhooks/stripe", content=again.body, headers=again.headers)).status_code == 200
    (reopened,) = await inbox_rows(resources)
    assert reopened.abandoned_at is None
    assert reopened.attempts == 0
    assert await queue_state(resources, row.id) == "queued"


async def test_a_connection_refusing_statements_leaves_the_pool_even_before_it_reads_as_closed(
    resources: Resources,
) -> None:
    """Between a killed backend's FATAL message and the socket's close, asyncpg is not closed yet but refuses
    every statement: the connection must leave the pool then too, or the retry draws it again."""

    async def pooled_backend() -> int:
        async with driver_connection(resources.db) as connection:
            return int(await connection.fetchval("SELECT pg_backend_pid()"))

    first = await pooled_backend()
    assert await pooled_backend() == first  # the pool hands the same connection back
    with pytest.raises(asyncpg.InternalClientError):
        async with driver_connection(resources.db):
            raise asyncpg.InternalClientError("cannot switch to state 11; another operation (2) is in progress")
    second = await pooled_backend()
    assert second != first
    with pytest.raises(ValueError):
        async with driver_connection(resources.db):
            raise ValueError("a bad row, not a bad connection")
    assert await pooled_backend() == second  # other errors keep the connection
    with pytest.raises(asyncio.CancelledError):
        async with driver_connection(resources.db):
            raise asyncio.CancelledError  # cancelled mid-statement: the protocol state is unknown
    assert await pooled_backend() != second
    assert cast(QueuePool, resources.db.engine.pool).checkedout() == 0  # every checkout went back, the dropped ones too


async def test_a_signed_event_with_nul_characters_is_stored_with_replacement_characters(
    client: Any, resources: Resources, webhook_secrets: dict[str, str]
) -> None:
    """jsonb cannot hold NUL: without care the event would get 503 on every delivery and never be stored."""
    event = subscription_event()
    event["data"]["object"]["metadata"] = {"note": "a\x00b", "path": "C:\\u0000"}  # a NUL, and an escaped backslash
    delivery = signed_stripe_delivery(event, webhook_secrets["stripe"])
    assert b"\\u0000" in delivery.body
    response = await client.post("/webhooks/stripe", content=delivery.body, headers=delivery.headers)
    assert response.status_code == 200
    (row,) = await inbox_rows(resources)
    assert row.payload["data"]["object"]["metadata"] == {"note": "a\ufffdb", "path": "C:\\u0000"}
    assert await queue_state(resources, row.id) == "queued"


async def test_an_escaped_backslash_before_u0000_is_stored_as_sent(
    client: Any, resources: Resources, webhook_secrets: dict[str, str]
) -> None:
    event = subscription_event()
    event["data"]["object"]["metadata"] = {"path": "C:\\u0000"}
    delivery = signed_stripe_delivery(event, webhook_secrets["stripe"])
    response = await client.post("/webhooks/stripe", content=delivery.body, headers=delivery.headers)
    assert response.status_code == 200
    (row,) = await inbox_rows(resources)
    assert row.payload == json.loads(delivery.body)


async def test_the_events_tenant_and_subject_are_stored_with_it(
    settings: Settings, resources: Resources, webhook_secrets: dict[str, str]
) -> None:
    """Decided at intake from the verified body by the module that handles it: billing for Stripe (the customer,
    and the subject its sync reads), identity for Clerk (the organization of a membership)."""
    async with AsyncTestClient(build_app(settings)) as client:  # the API's own modules
        await _post_both(client, webhook_secrets, membership := clerk_event("organizationMembership.created"))
    stripe_row, clerk_row = await inbox_rows(resources)
    assert (stripe_row.tenant_key, stripe_row.sync_subject) == ("cus_intake", "customer:cus_intake")
    organization = membership["data"]["organization"]["id"]
    assert (clerk_row.tenant_key, clerk_row.sync_subject) == (f"org:{organization}", None)


async def _post_both(client: Any, webhook_secrets: dict[str, str], membership: dict[str, Any]) -> None:
    stripe_delivery = signed_stripe_delivery(subscription_event(), webhook_secrets["stripe"])
    clerk_delivery = signed_clerk_delivery(membership, webhook_secrets["clerk"])
    for path, delivery in (("/webhooks/stripe", stripe_delivery), ("/webhooks/clerk", clerk_delivery)):
        assert (await client.post(path, content=delivery.body, headers=delivery.headers)).status_code == 200
