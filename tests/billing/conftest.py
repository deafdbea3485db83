"""Billing tests: the real pipeline and the real Stripe client, against the Stripe stub over HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import select

from app.billing import module as billing
from app.billing.models import BillingSync
from app.billing.sync import StripeSyncData, run_sync
from app.core.resources import Resources
from app.core.settings import load_settings
from app.identity import module as identity
from app.identity.models import Workspace
from app.runtime import open_resources as open_app_resources
from app.testing import Delivery, signed_stripe_delivery, stripe_event, stripe_subscription
from app.testing.fixtures import stripe_stub, stripe_stub_server
from app.testing.stripe_stub import StripeStub
from app.webhooks.handlers import stored_keys
from app.webhooks.inbox import Inbox
from app.webhooks.payload import decode_payload
from app.webhooks.processing import process_event
from tests.factories import WorkspaceFactory, persist

__all__ = ["stripe_stub", "stripe_stub_server"]

OpenResources = Callable[..., Awaitable[Resources]]


@pytest.fixture
def billing_env(settings_env: dict[str, str], stripe_stub: StripeStub) -> dict[str, str]:
    """Stripe calls go to the stub; queued jobs (the member limit) run inline after the commit."""
    return {**settings_env, "STRIPE_API_BASE": stripe_stub.base_url, "MESSAGE_QUEUE_DRIVER": "sync"}


@pytest.fixture
async def open_resources(billing_env: dict[str, str]) -> AsyncIterator[OpenResources]:
    """Resources of one process (an API or a worker) loading billing and identity; closed after the test."""
    opened: list[Resources] = []

    async def open_(**env: str) -> Resources:
        settings = load_settings({**billing_env, **env})
        opened.append(open_app_resources(settings, [billing.MODULE, identity.MODULE]))
        return opened[-1]

    yield open_
    for resources in opened:
        await resources.close()


@pytest.fixture
async def worker(open_resources: OpenResources) -> Resources:
    return await open_resources()


@pytest.fixture
async def linked_workspace(worker: Resources, stripe_stub: StripeStub) -> Workspace:
    """A workspace linked to Stripe customer ``cus_linked``, which the stub knows (without subscriptions)."""
    stripe_stub.put_customer("cus_linked")
    return await persist(worker.db, WorkspaceFactory.build(stripe_customer_id="cus_linked"))


def subscription_delivery(
    secret: str, customer: str, event_type: str = "customer.subscription.updated", **sub: Any
) -> Delivery:
    """A signed subscription event; its body is only a hint (which customer), never the state applied."""
    return signed_stripe_delivery(stripe_event(event_type, stripe_subscription(customer, **sub)), secret)


async def workspace_row(resources: Resources, workspace_id: int) -> Workspace:
    async with resources.db.session() as session:
        row = await session.get(Workspace, workspace_id)
    assert row is not None
    return row


async def store(resources: Resources, delivery: Delivery, provider: str = "stripe") -> int:
    """Stored as the intake stores it (with its tenant and sync subject), not processed: its row id."""
    payload = decode_payload(delivery.body)
    keys = await stored_keys([billing.MODULE, identity.MODULE], provider)(resources, delivery.event_type, payload)
    stored = await Inbox(resources.db).store(
        provider,
        delivery.event_id,
        delivery.event_type,
        delivery.body.decode(),
        tenant_key=keys.tenant,
        sync_subject=keys.subject,
    )
    return stored.row_id


async def event_try(resources: Resources, row_id: int) -> Exception | None:
    """The event's job once, with the sync driver: it asks for its subject's sync, which runs inline.

    Returns None when that ended (covered, set aside, or nothing to do), else
    what the sync raised: a ``RetryLater`` means an arq worker would run it
    again after ``after_seconds`` (the next try asks again and runs it).
    """
    try:
        await process_event(resources, row_id, "stripe")
    except Exception as exc:
        return exc
    return None


async def comes_back(resources: Resources, subject: str) -> Exception | None:
    """What a worker does when a sync's job comes back (its reservation, or the end of its backoff): runs it again.

    Returns None when the sync ended, else what it raised (it would come back again).
    """
    async with resources.db.session() as session:
        sync = await session.scalar(select(BillingSync).where(BillingSync.subject == subject))
    assert sync is not None and sync.pending, f"no sync of {subject} is pending"
    try:
        await run_sync(resources, StripeSyncData(subject, sync.generation, sync.calls))
    except Exception as exc:
        return exc
    return None


async def wait_for_stub_request(stub: StripeStub, method: str, path: str) -> None:
    """Until the stub has received ``method path`` (e.g. a checkout holding its link, waiting on its read)."""
    for _ in range(500):  # 5 s
        if (method, path) in stub.requests:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the Stripe stub never received {method} {path} within 5 s")


def health_checks_since(stub: StripeStub, first: int, in_flight: int = 0) -> list[float]:
    """When Stripe's health checks (an event list) arrived, from request ``first`` on: nothing else was asked
    there but at most ``in_flight`` calls already under way."""
    # Two reads of the stub's log: a request arriving between them is in the second alone, and zip drops it.
    since = list(zip(stub.requests, stub.request_times, strict=False))[first:]
    checks = [at for (_, path), at in since if path == "/v1/events"]
    assert len(since) - len(checks) <= in_flight, since
    return checks
