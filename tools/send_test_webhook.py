"""`make send-test-webhook PROVIDER=stripe|clerk`: a sample event, signed with the configured secret, posted to the API.

    python -m tools.send_test_webhook --provider clerk --url http://127.0.0.1:8000
    python -m tools.send_test_webhook --sample checkout        (`make send-test-webhook SAMPLE=checkout`)
    python -m tools.send_test_webhook --sample thin            (`make send-test-webhook SAMPLE=thin`)

A development tool (it builds the event with the test kit, ``app.testing``),
run through ``tools.dev_env`` so it signs with the secrets `make dev` generated.

``--sample checkout`` is the try-it pair (docs/operations.md, "Try it"): a Clerk ``organization.created``
(a workspace, processed at once) and a Stripe ``checkout.session.completed`` for that organization, whose
processing reads the checkout session from the Stripe API: under `make dev` the local stub, so it fails
(and is retried) until `make stripe-stub` runs; then Retry on /ops processes it.

``--sample thin`` is what an event destination with thin payloads sends (docs/deploy.md): a thin
``v1.customer.subscription.updated`` naming the try-it subscription, which its processing reads from the
Stripe API (`make stripe-stub` serves it) for its customer.
"""

from __future__ import annotations

import argparse
import sys

import httpx

from app.core.errors import exit_on_settings_error
from app.core.settings import Settings, get_settings
from app.testing.deliveries import (
    Delivery,
    clerk_event,
    random_id,
    signed_clerk_delivery,
    signed_stripe_delivery,
    stripe_event,
    stripe_object,
    stripe_subscription,
)
from app.testing.thin_deliveries import stripe_thin_event
from tools.dev_stripe import TRY_CHECKOUT, TRY_CUSTOMER, TRY_ORGANIZATION, TRY_SUBSCRIPTION


def _stripe_secret(settings: Settings) -> str:
    if not settings.stripe_webhook_secrets:
        raise SystemExit("STRIPE_WEBHOOK_SECRET is not set: `make dev` generates one.")
    return settings.stripe_webhook_secrets[0]


def _clerk_secret(settings: Settings) -> str:
    if not settings.clerk_webhook_signing_secret:
        raise SystemExit("CLERK_WEBHOOK_SIGNING_SECRET is not set: `make dev` generates one.")
    return settings.clerk_webhook_signing_secret


def sample_delivery(provider: str) -> Delivery:
    with exit_on_settings_error():
        settings = get_settings()
    if provider == "stripe":
        event = stripe_event("customer.subscription.updated", stripe_subscription(random_id("cus")))
        return signed_stripe_delivery(event, _stripe_secret(settings))
    return signed_clerk_delivery(clerk_event("user.created"), _clerk_secret(settings))


def thin_delivery() -> Delivery:
    """A thin event about the try-it subscription, as a destination with thin payloads sends it."""
    with exit_on_settings_error():
        settings = get_settings()
    return signed_stripe_delivery(
        stripe_thin_event("v1.customer.subscription.updated", TRY_SUBSCRIPTION), _stripe_secret(settings)
    )


def checkout_deliveries() -> list[tuple[str, Delivery]]:
    """The try-it pair: the organization (a workspace), then its checkout, which needs the Stripe API."""
    with exit_on_settings_error():
        settings = get_settings()
    organization = clerk_event("organization.created", id=TRY_ORGANIZATION, name="Try it", slug="try-it")
    checkout = stripe_object(
        "checkout.session", id=TRY_CHECKOUT, customer=TRY_CUSTOMER, client_reference_id=TRY_ORGANIZATION
    )
    return [
        ("clerk", signed_clerk_delivery(organization, _clerk_secret(settings))),
        (
            "stripe",
            signed_stripe_delivery(stripe_event("checkout.session.completed", checkout), _stripe_secret(settings)),
        ),
    ]


def _post(url: str, provider: str, delivery: Delivery) -> int:
    try:
        response = httpx.post(f"{url.rstrip('/')}/webhooks/{provider}", content=delivery.body, headers=delivery.headers)
    except httpx.HTTPError as exc:
        print(f"Could not reach {url} ({exc}): is the API running (`make dev`)?", file=sys.stderr)
        return 1
    sent = f"Sent {provider} {delivery.event_type} event {delivery.event_id}"
    print(f"{sent}: HTTP {response.status_code} {response.text}")
    return 0 if response.status_code == 200 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--provider", choices=["stripe", "clerk"], default="stripe")
    parser.add_argument(
        "--sample",
        choices=["event", "checkout", "thin"],
        default="event",
        help="event: one sample event of --provider; checkout: the try-it pair (docs/operations.md, Try it); "
        "thin: a Stripe thin event (docs/deploy.md)",
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="base URL of the running API")
    args = parser.parse_args(argv)
    if args.sample == "event":
        return _post(args.url, args.provider, sample_delivery(args.provider))
    if args.sample == "thin":
        return _post(args.url, "stripe", thin_delivery())
    for provider, delivery in checkout_deliveries():
        if code := _post(args.url, provider, delivery):
            return code
    base = get_settings().stripe_api_base
    print(
        f"The checkout's processing reads checkout session {TRY_CHECKOUT} from the Stripe API at {base}: until "
        f"that answers, it fails and is retried. See it on {args.url.rstrip('/')}/ops, run `make stripe-stub` "
        "in another shell, then press Retry on its page."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
