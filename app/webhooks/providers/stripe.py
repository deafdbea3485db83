"""Stripe: ``Stripe-Signature`` verified by the stripe package, several secrets for rotation."""

from __future__ import annotations

import stripe

from app.core.settings import Settings
from app.webhooks.providers.base import (
    Headers,
    PayloadError,
    SignatureError,
    VerifiedEvent,
    Verifier,
    WebhookProvider,
    parse_event_head,
    type_matcher,
)

TOLERANCE_SECONDS = 300

HANDLED_TYPES = (
    "checkout.session.completed",
    "customer.subscription.*",
    "invoice.paid",
    "invoice.payment_failed",
    "charge.dispute.*",
    "charge.refunded",
    "refund.*",
    "radar.early_fraud_warning.*",
)


def _verifier(settings: Settings) -> Verifier | None:
    if not settings.stripe_enabled:
        return None
    secrets = settings.stripe_webhook_secrets

    def verify(body: bytes, headers: Headers) -> VerifiedEvent:
        if not secrets:
            raise SignatureError("STRIPE_WEBHOOK_SECRET is not set on this server, so no signature can verify.")
        header = headers.get("stripe-signature")
        if not header:
            raise SignatureError("Missing Stripe-Signature header.")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise SignatureError("Body is not UTF-8, so it cannot carry a valid Stripe signature.") from None
        if not _any_secret_verifies(text, header, secrets):
            raise SignatureError(
                "Stripe signature does not match any configured secret, or its timestamp is older than "
                f"{TOLERANCE_SECONDS}s. Check STRIPE_WEBHOOK_SECRET."
            )
        return _parse(body)

    return verify


def _any_secret_verifies(text: str, header: str, secrets: tuple[str, ...]) -> bool:
    for secret in secrets:
        try:
            stripe.WebhookSignature.verify_header(text, header, secret, tolerance=TOLERANCE_SECONDS)
        except stripe.SignatureVerificationError:
            continue
        return True
    return False


def _parse(body: bytes) -> VerifiedEvent:
    event_id, event_type = parse_event_head(body)
    if not isinstance(event_id, str) or not isinstance(event_type, str) or not event_id:
        raise PayloadError("A Stripe event needs string 'id' and 'type' fields.")
    return VerifiedEvent(event_id=event_id, event_type=event_type)


STRIPE = WebhookProvider(name="stripe", build_verifier=_verifier, handles=type_matcher(*HANDLED_TYPES))
