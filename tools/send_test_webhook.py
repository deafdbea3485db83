"""`make send-test-webhook PROVIDER=stripe|clerk`: a sample event, signed with the configured secret, posted to the API.

    python -m tools.send_test_webhook --provider clerk --url http://127.0.0.1:8000

A development tool (it builds the event with the test kit, ``app.testing``),
run through ``tools.dev_env`` so it signs with the secrets `make dev` generated.
"""

from __future__ import annotations

import argparse
import sys

import httpx

from app.core.errors import exit_on_settings_error
from app.core.settings import get_settings
from app.testing.deliveries import (
    Delivery,
    clerk_event,
    random_id,
    signed_clerk_delivery,
    signed_stripe_delivery,
    stripe_event,
    stripe_subscription,
)


def sample_delivery(provider: str) -> Delivery:
    with exit_on_settings_error():
        settings = get_settings()
    if provider == "stripe":
        if not settings.stripe_webhook_secrets:
            raise SystemExit("STRIPE_WEBHOOK_SECRET is not set: `make dev` generates one.")
        event = stripe_event("customer.subscription.updated", stripe_subscription(random_id("cus")))
        return signed_stripe_delivery(event, settings.stripe_webhook_secrets[0])
    if not settings.clerk_webhook_signing_secret:
        raise SystemExit("CLERK_WEBHOOK_SIGNING_SECRET is not set: `make dev` generates one.")
    return signed_clerk_delivery(clerk_event("user.created"), settings.clerk_webhook_signing_secret)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--provider", choices=["stripe", "clerk"], default="stripe")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="base URL of the running API")
    args = parser.parse_args(argv)
    delivery = sample_delivery(args.provider)
    try:
        response = httpx.post(
            f"{args.url.rstrip('/')}/webhooks/{args.provider}", content=delivery.body, headers=delivery.headers
        )
    except httpx.HTTPError as exc:
        print(f"Could not reach {args.url} ({exc}): is the API running (`make dev`)?", file=sys.stderr)
        return 1
    sent = f"Sent {args.provider} {delivery.event_type} event {delivery.event_id}"
    print(f"{sent}: HTTP {response.status_code} {response.text}")
    return 0 if response.status_code == 200 else 1


if __name__ == "__main__":
    raise SystemExit(main())
