"""Intake of Stripe's thin events (an event destination with thin payloads) on the one Stripe route: verified with
the destination's own secret, stored once under their type as sent, or refused; the ping and unhandled types
answered 200 and dropped."""

from __future__ import annotations

from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from prometheus_client import REGISTRY

from app.asgi import build_app
from app.core.resources import Resources
from app.core.settings import load_settings
from app.testing import (
    signed_stripe_delivery,
    stripe_event,
    stripe_ping_event,
    stripe_subscription,
    stripe_thin_event,
    stripe_thin_twin,
)
from app.webhooks.inbox import Inbox
from app.webhooks.jobs import deduplication_id
from tests.factories import WorkspaceFactory, persist
from tests.webhooks.conftest import inbox_count, inbox_rows


def refused_payloads() -> float:
    return (
        REGISTRY.get_sample_value("webhook_deliveries_total", {"provider": "stripe", "outcome": "rejected_payload"})
        or 0.0
    )


async def test_a_thin_event_is_stored_once_under_its_type_as_sent_and_queued(
    client: Any, resources: Resources, webhook_secrets: dict[str, str]
) -> None:
    delivery = signed_stripe_delivery(stripe_thin_event("v1.invoice.paid", "in_stored"), webhook_secrets["stripe"])
    for _ in range(2):
        response = await client.post("/webhooks/stripe", content=delivery.body, headers=delivery.headers)
        assert response.status_code == 200 and response.json() == {"received": True}

    (row,) = await inbox_rows(resources)
    assert (row.provider, row.event_id, row.type) == ("stripe", delivery.event_id, "v1.invoice.paid")
    assert row.payload["related_object"]["id"] == "in_stored"
    assert await resources.queue.state(deduplication_id(row.id), "webhook-stripe-queue") == "queued"


async def test_a_thin_destinations_own_secret_verifies(
    make_client: Any, resources: Resources, webhook_secrets: dict[str, str]
) -> None:
    """A snapshot endpoint and a thin destination, each with its secret, both listed in STRIPE_WEBHOOK_SECRET."""
    snapshot_secret, thin_secret = webhook_secrets["stripe"], webhook_secrets["stripe_old"]
    client = await make_client(STRIPE_WEBHOOK_SECRET=f"{snapshot_secret},{thin_secret}")
    snapshot = stripe_event("customer.subscription.updated", stripe_subscription("cus_two"))
    for delivery in (
        signed_stripe_delivery(snapshot, snapshot_secret),
        signed_stripe_delivery(stripe_thin_twin(snapshot), thin_secret),
    ):
        response = await client.post("/webhooks/stripe", content=delivery.body, headers=delivery.headers)
        assert response.status_code == 200, response.text
    assert sorted(row.type for row in await inbox_rows(resources)) == [
        "customer.subscription.updated",
        "v1.customer.subscription.updated",
    ]

    only_snapshot = await make_client(STRIPE_WEBHOOK_SECRET=snapshot_secret)
    other = signed_stripe_delivery(stripe_thin_event("v1.invoice.paid", "in_other"), thin_secret)
    assert (await only_snapshot.post("/webhooks/stripe", content=other.body, headers=other.headers)).status_code == 400
    assert await inbox_count(resources) == 2


@pytest.mark.parametrize(
    "event",
    [
        pytest.param(stripe_ping_event(), id="ping"),
        pytest.param(stripe_thin_event("v1.charge.captured", "ch_unhandled"), id="unhandled-v1-type"),
        pytest.param(
            stripe_thin_event("v1.billing.meter.no_meter_found", "x", "billing.meter", related_object=None),
            id="unhandled-without-related-object",
        ),
        pytest.param(stripe_thin_event("v2.core.account.updated", "acct_1", "v2.core.account"), id="unhandled-v2-type"),
    ],
)
async def test_the_ping_and_unhandled_thin_types_are_answered_200_and_store_nothing(
    client: Any, resources: Resources, webhook_secrets: dict[str, str], event: dict[str, Any]
) -> None:
    delivery = signed_stripe_delivery(event, webhook_secrets["stripe"])
    response = await client.post("/webhooks/stripe", content=delivery.body, headers=delivery.headers)
    assert (response.status_code, response.json()) == (200, {"received": True})
    assert await inbox_count(resources) == 0


@pytest.mark.parametrize(
    "related",
    [
        None,
        "sub_1",
        {},
        {"id": "sub_1"},
        {"type": "subscription"},
        {"id": "", "type": "subscription"},
        {"id": 12, "type": "subscription"},
        {"id": "sub_1", "type": ["subscription"]},
        {"id": "s" * 256, "type": "subscription"},
    ],
)
async def test_a_handled_thin_event_without_a_related_object_id_and_type_is_400_and_stores_nothing(
    client: Any, resources: Resources, webhook_secrets: dict[str, str], related: Any
) -> None:
    refused = refused_payloads()
    event = stripe_thin_event("v1.customer.subscription.updated", "sub_1", related_object=related)
    if related is None:
        assert "related_object" not in event
    delivery = signed_stripe_delivery(event, webhook_secrets["stripe"])
    response = await client.post("/webhooks/stripe", content=delivery.body, headers=delivery.headers)
    assert response.status_code == 400
    assert "related_object" in response.json()["detail"]
    assert await inbox_count(resources) == 0
    assert refused_payloads() == refused + 1


async def test_a_thin_event_about_a_synced_subscription_is_stored_under_its_customer(
    settings_env: dict[str, str], resources: Resources, webhook_secrets: dict[str, str]
) -> None:
    """With billing loaded, the intake asks what billing holds: the customer's tenant and sync, no read to learn it."""
    await persist(resources.db, WorkspaceFactory.build(stripe_customer_id="cus_held", subscription_id="sub_held"))
    snapshot = stripe_event("customer.subscription.updated", stripe_subscription("cus_new", id="sub_new"))
    deliveries = [
        signed_stripe_delivery(
            stripe_thin_event("v1.customer.subscription.updated", "sub_held"), webhook_secrets["stripe"]
        ),
        signed_stripe_delivery(snapshot, webhook_secrets["stripe"]),
        signed_stripe_delivery(stripe_thin_twin(snapshot), webhook_secrets["stripe"]),  # after its twin: its keys
        signed_stripe_delivery(
            stripe_thin_event("v1.customer.subscription.updated", "sub_nobody"), webhook_secrets["stripe"]
        ),
        signed_stripe_delivery(stripe_thin_event("v1.invoice.paid", "in_nobody"), webhook_secrets["stripe"]),
        signed_stripe_delivery(stripe_thin_event("v1.charge.dispute.created", "dp_new"), webhook_secrets["stripe"]),
    ]
    async with AsyncTestClient(build_app(load_settings({**settings_env, "MESSAGE_QUEUE_DRIVER": "arq"}))) as client:
        for delivery in deliveries:
            assert (
                await client.post("/webhooks/stripe", content=delivery.body, headers=delivery.headers)
            ).status_code == 200
    keys = [(row.tenant_key, row.sync_subject) for row in await Inbox(resources.db).page(provider="stripe")]
    assert keys[::-1] == [
        ("cus_held", "customer:cus_held"),
        ("cus_new", "customer:cus_new"),
        ("cus_new", "customer:cus_new"),
        ("sub_nobody", "subscription:sub_nobody"),  # its sync reads the subscription for its customer
        ("in_nobody", "invoice:in_nobody"),
        ("dp_new", "dispute:dp_new"),  # the subject a snapshot dispute event has
    ]
