"""Signed deliveries must verify with the providers' own SDKs, exactly as production code checks them."""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime, timedelta, timezone

import pytest
import stripe
from svix.webhooks import Webhook, WebhookVerificationError

from app.testing.deliveries import (
    clerk_event,
    generate_whsec,
    signed_clerk_delivery,
    signed_stripe_delivery,
    stripe_event,
    stripe_object,
    stripe_subscription,
)


def test_signed_stripe_delivery_is_accepted_by_construct_event() -> None:
    secret = generate_whsec()
    sub = stripe_subscription("cus_1", id="sub_1", quantity=5)
    delivery = signed_stripe_delivery(stripe_event("customer.subscription.updated", sub), secret)

    event = stripe.Webhook.construct_event(delivery.body, delivery.headers["Stripe-Signature"], secret)

    assert event.id == delivery.event_id
    assert event.type == delivery.event_type == "customer.subscription.updated"
    assert event.data.object["id"] == "sub_1"
    assert delivery.headers["Content-Type"] == "application/json"


def test_altered_stripe_body_is_rejected() -> None:
    secret = generate_whsec()
    delivery = signed_stripe_delivery(stripe_event("customer.updated", stripe_object("customer")), secret)
    forged = delivery.body.replace(b'"customer.updated"', b'"customer.deleted"')

    with pytest.raises(stripe.SignatureVerificationError):
        stripe.Webhook.construct_event(forged, delivery.headers["Stripe-Signature"], secret)


def test_stripe_delivery_signed_with_another_secret_is_rejected() -> None:
    delivery = signed_stripe_delivery(stripe_event("invoice.paid", stripe_object("invoice")), generate_whsec())

    with pytest.raises(stripe.SignatureVerificationError):
        stripe.Webhook.construct_event(delivery.body, delivery.headers["Stripe-Signature"], generate_whsec())


def test_stale_stripe_timestamp_is_rejected_by_tolerance() -> None:
    secret = generate_whsec()
    old = int(time.time()) - 301
    delivery = signed_stripe_delivery(stripe_event("charge.refunded", stripe_object("charge")), secret, timestamp=old)

    with pytest.raises(stripe.SignatureVerificationError):
        stripe.Webhook.construct_event(delivery.body, delivery.headers["Stripe-Signature"], secret)


def test_stripe_delivery_during_rotation_verifies_with_either_secret() -> None:
    old_secret, new_secret = generate_whsec(), generate_whsec()
    delivery = signed_stripe_delivery(stripe_event("refund.updated", stripe_object("refund")), [old_secret, new_secret])

    for secret in (old_secret, new_secret):
        stripe.Webhook.construct_event(delivery.body, delivery.headers["Stripe-Signature"], secret)
    assert delivery.headers["Stripe-Signature"].count("v1=") == 2


def test_stripe_event_envelope_has_the_fixture_shape() -> None:
    obj = stripe_object("dispute", id="dp_1", charge="ch_1")
    event = stripe_event("charge.dispute.created", obj, event_id="evt_1", created=1_700_000_000)

    assert event["id"] == "evt_1"
    assert event["object"] == "event"
    assert event["created"] == 1_700_000_000
    assert event["data"] == {"object": obj}
    assert event["livemode"] is False
    assert event["api_version"] == stripe.api_version
    assert stripe_event("customer.created", obj)["id"].startswith("evt_")


def test_stripe_object_gets_fresh_ids_with_the_fixture_prefix() -> None:
    first, second = stripe_object("checkout.session"), stripe_object("checkout.session")

    assert first["id"] != second["id"]
    assert first["id"].startswith("cs_test_")
    assert stripe_object("customer", id="cus_1", email="a@example.com")["email"] == "a@example.com"
    with pytest.raises(KeyError, match="No Stripe fixture"):
        stripe_object("no_such_kind")


def test_stripe_subscription_carries_seats_price_and_period_end_in_both_places() -> None:
    sub = stripe_subscription("cus_1", id="sub_1", quantity=7, price_id="price_team", current_period_end=1_900_000_000)
    item = sub["items"]["data"][0]

    assert (sub["customer"], sub["status"], sub["cancel_at_period_end"]) == ("cus_1", "active", False)
    assert (item["price"]["id"], item["quantity"], item["subscription"]) == ("price_team", 7, "sub_1")
    assert sub["current_period_end"] == item["current_period_end"] == 1_900_000_000
    assert stripe_subscription("cus_1", status="canceled")["ended_at"] is not None


def test_signed_clerk_delivery_is_accepted_by_svix() -> None:
    secret = generate_whsec()
    event = clerk_event("user.updated", id="user_1", first_name="Ada")
    delivery = signed_clerk_delivery(event, secret, msg_id="msg_1")

    Webhook(secret).verify(delivery.body, delivery.headers)

    assert delivery.event_id == delivery.headers["svix-id"] == "msg_1"
    assert delivery.event_type == "user.updated"
    assert json.loads(delivery.body)["data"]["first_name"] == "Ada"


def test_altered_clerk_body_is_rejected() -> None:
    secret = generate_whsec()
    delivery = signed_clerk_delivery(clerk_event("organization.created"), secret)

    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(delivery.body.replace(b"Acme", b"Evil"), delivery.headers)


def test_clerk_signature_is_right_for_an_aware_non_utc_timestamp() -> None:
    secret = generate_whsec()
    local_now = datetime.now(timezone(timedelta(hours=2)))
    delivery = signed_clerk_delivery(clerk_event("user.deleted"), secret, timestamp=local_now)

    Webhook(secret).verify(delivery.body, delivery.headers)
    assert delivery.headers["svix-timestamp"] == str(int(local_now.timestamp()))


def test_clerk_delivery_refuses_a_naive_timestamp() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        signed_clerk_delivery(clerk_event("user.created"), generate_whsec(), timestamp=datetime.now())


def test_stale_clerk_delivery_is_rejected() -> None:
    secret = generate_whsec()
    old = datetime.now(UTC) - timedelta(minutes=6)
    delivery = signed_clerk_delivery(clerk_event("user.created"), secret, timestamp=old)

    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(delivery.body, delivery.headers)


def test_clerk_event_timestamp_is_ms_and_updated_at_follows_it() -> None:
    event = clerk_event("organizationMembership.updated", timestamp=1_700_000_000_123, role="org:admin")

    assert event["timestamp"] == event["data"]["updated_at"] == 1_700_000_000_123
    assert event["data"]["role"] == "org:admin"
    assert event["instance_id"]
    assert clerk_event("user.updated", updated_at=5)["data"]["updated_at"] == 5
    assert abs(clerk_event("user.created")["timestamp"] - time.time() * 1000) < 60_000
    with pytest.raises(KeyError, match="No Clerk fixture"):
        clerk_event("session.created")


def test_generated_secret_is_valid_for_stripe_and_svix() -> None:
    secret = generate_whsec()

    assert secret.startswith("whsec_")
    assert len(base64.b64decode(secret.removeprefix("whsec_"))) == 24
    assert secret != generate_whsec()
    Webhook(secret)  # svix decodes the key: raises on a malformed one
