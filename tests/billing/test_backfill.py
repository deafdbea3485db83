"""Gap detection: the events Stripe lists but the inbox never received are stored as intake would, once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest

from app.core.module import loaded_modules
from app.core.sentry import flush_sentry, init_sentry
from app.core.settings import load_settings
from app.queue.cli import run_cron_now
from app.runtime import open_resources as open_app_resources
from app.testing import stripe_event, stripe_subscription, stripe_thin_event
from app.testing.processes import child_env
from app.testing.stripe_stub import StripeStub
from app.webhooks.backfill import backfill, event_sources
from app.webhooks.crons import WebhookBackfillCronJob
from app.webhooks.inbox import Inbox
from app.webhooks.jobs import deduplication_id
from tests.billing.conftest import OpenResources
from tests.processes import ROOT
from tests.stubs.sentry_ingest import SentryIngestStub

HOUR = 3600


def listed(stub: StripeStub, event_type: str, age_seconds: int) -> dict[str, object]:
    event = stripe_event(event_type, stripe_subscription("cus_gap"), created=int(time.time()) - age_seconds)
    return stub.put_event(event)


def window() -> tuple[datetime, datetime]:
    now = datetime.now(UTC)
    return now - timedelta(hours=72), now


async def test_backfill_stores_exactly_the_missing_events_once_and_alerts_once(
    billing_env: dict[str, str], stripe_stub: StripeStub, sentry_enabled: SentryIngestStub
) -> None:
    settings = load_settings({**billing_env, "MESSAGE_QUEUE_DRIVER": "arq", "SENTRY_DSN": sentry_enabled.dsn})
    init_sentry(settings, "cli")
    resources = open_app_resources(settings)
    try:
        delivered = [listed(stripe_stub, "customer.subscription.updated", HOUR * n) for n in (1, 2)]
        lost = [listed(stripe_stub, "invoice.paid", HOUR * n) for n in (3, 4, 5)]
        listed(stripe_stub, "payout.paid", HOUR)  # a type billing does not handle
        listed(stripe_stub, "invoice.paid", HOUR * 80)  # before the window
        inbox = Inbox(resources.db)
        for event in delivered:
            await inbox.store("stripe", str(event["id"]), str(event["type"]), '{"id": "x", "type": "y"}')
        source = event_sources(loaded_modules(resources))["stripe"]

        dry = await backfill(resources, "stripe", source, *window(), dry_run=True)
        assert dry.summary() == "Would backfill 3 Stripe events (2 already in the inbox)."
        assert await inbox.missing("stripe", [str(e["id"]) for e in lost]) == {str(e["id"]) for e in lost}

        first = await backfill(resources, "stripe", source, *window())
        again = await backfill(resources, "stripe", source, *window())
        for event in lost:
            (row,) = await inbox.find(str(event["id"]), "stripe")
            assert row.type == "invoice.paid" and row.processed_at is None
            assert await resources.queue.state(deduplication_id(row.id), "webhook-stripe-queue") == "queued"
    finally:
        await resources.close()
    assert first.summary() == "Backfilled 3 Stripe events (2 already in the inbox)."
    assert again.summary() == "Backfilled 0 Stripe events (5 already in the inbox)."
    flush_sentry()
    alerts = sentry_enabled.wait_for(lambda items: len(items) >= 1)
    (alert,) = [item for item in alerts if "exception" not in item]
    text = alert.get("logentry", {}).get("message") or alert.get("message", "")
    assert "3 Stripe events" in text and str(lost[-1]["id"]) in text  # how many, and the oldest


async def test_the_cron_stores_events_past_the_grace_and_alerts_once(
    billing_env: dict[str, str], stripe_stub: StripeStub, sentry_enabled: SentryIngestStub
) -> None:
    """The acceptance's case: events created while the worker was stopped are stored by the next tick (as
    `crons run WebhookBackfillCronJob` runs it) once older than WEBHOOK_BACKFILL_GRACE_SECONDS (default 60)."""
    settings = load_settings({**billing_env, "MESSAGE_QUEUE_DRIVER": "arq", "SENTRY_DSN": sentry_enabled.dsn})
    assert settings.webhook_backfill_grace_seconds == 60
    init_sentry(settings, "worker")
    resources = open_app_resources(settings)
    try:
        lost = [listed(stripe_stub, "invoice.paid", age) for age in (90, 300)]
        on_its_way = listed(stripe_stub, "invoice.paid", 5)  # younger than the grace: left to its delivery
        inbox = Inbox(resources.db)

        await run_cron_now(resources, WebhookBackfillCronJob)
        await run_cron_now(resources, WebhookBackfillCronJob)  # finds nothing new: no second alert

        assert await inbox.missing("stripe", [str(e["id"]) for e in [*lost, on_its_way]]) == {str(on_its_way["id"])}
        for event in lost:
            (row,) = await inbox.find(str(event["id"]), "stripe")
            assert await resources.queue.state(deduplication_id(row.id), "webhook-stripe-queue") == "queued"
    finally:
        await resources.close()
    flush_sentry()  # everything sent: a second alert, were there one, would be in
    alerts = sentry_enabled.wait_for(lambda items: len(items) >= 1)
    gaps = [item for item in alerts if "exception" not in item and "Webhook gap" in str(item)]
    assert len(gaps) == 1, alerts
    assert "2 Stripe events" in str(gaps[0]) and str(lost[-1]["id"]) in str(gaps[0])


async def test_backfill_pages_through_every_event_of_every_handled_type(
    open_resources: OpenResources, stripe_stub: StripeStub
) -> None:
    resources = await open_resources(MESSAGE_QUEUE_DRIVER="arq")
    types = ["customer.subscription.updated", "radar.early_fraud_warning.updated", "refund.failed"]
    for n in range(240):
        listed(stripe_stub, types[n % 3], 60 + n)
    source = event_sources(loaded_modules(resources))["stripe"]
    report = await backfill(resources, "stripe", source, *window())
    assert (report.stored, report.already) == (240, 0)
    paths = [path for _, path in stripe_stub.requests]
    assert paths.count("/v1/events") == 3  # 160 events in the first group of 20 types (2 pages), 80 in the second


@pytest.mark.slow
def test_the_command_says_what_it_did(billing_env: dict[str, str], stripe_stub: StripeStub) -> None:
    listed(stripe_stub, "invoice.paid", HOUR)
    litestar = [os.path.join(os.path.dirname(sys.executable), "litestar"), "--app", "app.asgi:create_app"]
    env = child_env({**billing_env, "MESSAGE_QUEUE_DRIVER": "arq"})

    def run(*args: str) -> str:
        done = subprocess.run([*litestar, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().splitlines()[-1]

    assert (
        run("webhooks", "backfill", "stripe", "--dry-run") == "Would backfill 1 Stripe event (0 already in the inbox)."
    )
    assert (
        run("webhooks", "backfill", "stripe", "--since", "2h") == "Backfilled 1 Stripe event (0 already in the inbox)."
    )
    assert run("webhooks", "backfill", "stripe") == "Backfilled 0 Stripe events (1 already in the inbox)."


def listed_thin(stub: StripeStub, event_type: str, age_seconds: int, related_id: str = "in_gap") -> dict[str, object]:
    created = datetime.now(UTC) - timedelta(seconds=age_seconds)
    return stub.put_thin_event(stripe_thin_event(event_type, related_id, created=created))


async def test_with_thin_payloads_the_backfill_stores_exactly_the_missing_thin_events_and_none_with_snapshot_alone(
    open_resources: OpenResources, stripe_stub: StripeStub, sentry_enabled: SentryIngestStub
) -> None:
    delivered = [listed_thin(stripe_stub, "v1.invoice.paid", HOUR * n) for n in (1, 2)]
    lost = [
        listed_thin(stripe_stub, "v1.customer.subscription.updated", HOUR * 3, "sub_gap"),
        listed_thin(stripe_stub, "v1.invoice.payment_failed", HOUR * 4),
        listed_thin(stripe_stub, "v1.refund.failed", HOUR * 5, "re_gap"),
    ]
    listed_thin(stripe_stub, "v1.charge.captured", HOUR, "ch_gap")  # a type billing does not handle
    listed_thin(stripe_stub, "v1.invoice.paid", HOUR * 80)  # before the window
    lost_snapshot = listed(stripe_stub, "invoice.paid", HOUR)
    resources = await open_resources(MESSAGE_QUEUE_DRIVER="arq", SENTRY_DSN=sentry_enabled.dsn)
    inbox = Inbox(resources.db)
    for event in delivered:
        await inbox.store("stripe", str(event["id"]), str(event["type"]), '{"id": "x", "type": "y"}')
    source = event_sources(loaded_modules(resources))["stripe"]

    snapshot_alone = await backfill(resources, "stripe", source, *window())
    assert snapshot_alone.summary() == "Backfilled 1 Stripe event (0 already in the inbox)."
    assert not [path for _, path in stripe_stub.requests if path.startswith("/v2/")]
    assert await inbox.missing("stripe", [str(e["id"]) for e in lost]) == {str(e["id"]) for e in lost}

    moving = await open_resources(MESSAGE_QUEUE_DRIVER="arq", STRIPE_EVENT_PAYLOADS="snapshot,thin")
    first = await backfill(moving, "stripe", source, *window())
    again = await backfill(moving, "stripe", source, *window())

    assert first.summary() == "Backfilled 3 Stripe events (3 already in the inbox)."  # 2 thin delivered, 1 snapshot
    assert again.summary() == "Backfilled 0 Stripe events (6 already in the inbox)."
    assert first.oldest is not None and first.oldest.event_id == lost[-1]["id"]
    stored = {row.event_id: row for event in lost for row in await inbox.find(str(event["id"]), "stripe")}
    assert {(row.type, row.tenant_key, row.sync_subject) for row in stored.values()} == {
        ("v1.customer.subscription.updated", "sub_gap", "subscription:sub_gap"),
        ("v1.invoice.payment_failed", "in_gap", "invoice:in_gap"),
        ("v1.refund.failed", "re_gap", "refund:re_gap"),
    }
    for row in stored.values():
        assert await moving.queue.state(deduplication_id(row.id), "webhook-stripe-queue") == "queued"
    assert str(lost_snapshot["id"]) not in {row.event_id for row in stored.values()}

    thin_alone = await open_resources(MESSAGE_QUEUE_DRIVER="arq", STRIPE_EVENT_PAYLOADS="thin")
    asked_before = len(stripe_stub.requests)
    assert (await backfill(thin_alone, "stripe", source, *window())).summary() == (
        "Backfilled 0 Stripe events (5 already in the inbox)."
    )
    assert {path for _, path in stripe_stub.requests[asked_before:]} == {"/v2/core/events"}


async def test_the_thin_backfill_follows_every_next_page_url(
    open_resources: OpenResources, stripe_stub: StripeStub
) -> None:
    resources = await open_resources(MESSAGE_QUEUE_DRIVER="arq", STRIPE_EVENT_PAYLOADS="thin")
    types = ["v1.customer.subscription.updated", "v1.radar.early_fraud_warning.updated", "v1.refund.failed"]
    for n in range(240):
        listed_thin(stripe_stub, types[n % 3], 60 + n, f"obj_{n}")
    source = event_sources(loaded_modules(resources))["stripe"]
    report = await backfill(resources, "stripe", source, *window())
    assert (report.stored, report.already) == (240, 0)
    paths = [path for _, path in stripe_stub.requests]
    # 80 events of the first group of 20 types (the checkout's and subscriptions': 1 page), 160 of the second group
    # (2 pages of 100: the second through the first's next_page_url)
    assert paths == ["/v2/core/events"] * 4
