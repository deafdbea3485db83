"""Stripe: ``Stripe-Signature`` verified by the stripe package, several secrets for rotation.

The SDK checks the HMAC and rejects old timestamps; the header is checked here
first for what the SDK does not refuse by itself: non-ASCII values (its
``hmac.compare_digest`` raises ``TypeError``), oversized headers, a missing or
non-numeric timestamp, and a timestamp more than 300 s in the future.
"""

from __future__ import annotations

import time

import stripe

from app.core.settings import Settings
from app.queue.queues import QueueName
from app.webhooks.providers.base import (
    Headers,
    OpenAPIType,
    Schema,
    SignatureError,
    VerifiedEvent,
    Verifier,
    WebhookProvider,
    WebhookSignatureGuard,
    decode_payload,
    event_key_schema,
    signature_header,
)

TOLERANCE_SECONDS = 300
HEADER = "Stripe-Signature"


def _verifier(settings: Settings) -> Verifier | None:
    if not settings.stripe_enabled:
        return None
    secrets = settings.stripe_webhook_secrets

    def verify(body: bytes, headers: Headers) -> VerifiedEvent:
        if not secrets:
            raise SignatureError("STRIPE_WEBHOOK_SECRET is not set on this server, so no signature can verify.")
        header = signature_header(headers, HEADER)
        _check_timestamp(header)
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise SignatureError("Body is not UTF-8, so it cannot carry a valid Stripe signature.") from None
        if not _any_secret_verifies(text, header, secrets):
            raise SignatureError(
                "Stripe signature does not match any configured secret, or its timestamp is older than "
                f"{TOLERANCE_SECONDS}s. Check STRIPE_WEBHOOK_SECRET."
            )
        payload = decode_payload(body)
        return VerifiedEvent.of(payload.get("id"), payload.get("type"), payload, body)

    return verify


def _check_timestamp(header: str) -> None:
    """Exactly one numeric ``t=`` within 300 s of now, and at least one ``v1=`` signature."""
    pairs = [item.partition("=") for item in header.split(",")]
    timestamps = [value for key, sep, value in pairs if sep and key.strip() == "t"]
    if len(timestamps) != 1 or not timestamps[0].strip().isdigit() or len(timestamps[0].strip()) > 12:
        raise SignatureError(f"{HEADER} header is garbled: it needs one numeric t= timestamp.")
    if not any(sep and key.strip() == "v1" and value for key, sep, value in pairs):
        raise SignatureError(f"{HEADER} header carries no v1= signature.")
    if int(timestamps[0]) > time.time() + TOLERANCE_SECONDS:
        raise SignatureError(
            f"{HEADER} timestamp is more than {TOLERANCE_SECONDS}s in the future: check the sender's clock."
        )


def _any_secret_verifies(text: str, header: str, secrets: tuple[str, ...]) -> bool:
    for secret in secrets:
        try:
            stripe.WebhookSignature.verify_header(text, header, secret, tolerance=TOLERANCE_SECONDS)
        except Exception:  # SignatureVerificationError, or whatever an odd (pre-checked) header makes it raise
            continue
        return True
    return False


class StripeWebhookSignatureGuard(WebhookSignatureGuard):
    """The guard of ``POST /webhooks/stripe``: checks ``Stripe-Signature`` against every configured secret."""


BODY = Schema(
    type=OpenAPIType.OBJECT,
    title="StripeEvent",
    description="A Stripe event as Stripe sends it, stored as sent once its signature verifies.",
    required=["id", "type"],
    properties={
        "id": event_key_schema("The event's id (evt_...): the inbox's key, so a redelivery is stored once."),
        "type": event_key_schema(
            "customer.subscription.updated, invoice.paid...: a type no module handles is answered 200."
        ),
        "object": Schema(type=OpenAPIType.STRING, const="event"),
        "created": Schema(type=OpenAPIType.INTEGER, description="Unix time of the event."),
        "data": Schema(
            type=OpenAPIType.OBJECT,
            description="``data.object``: what the event is about (its customer is read again from Stripe).",
            properties={"object": Schema(type=OpenAPIType.OBJECT)},
        ),
    },
    examples=[{"id": "evt_1", "object": "event", "type": "invoice.paid", "data": {"object": {"customer": "cus_1"}}}],
)

STRIPE = WebhookProvider(
    body_schema=BODY,
    body_refused="a body that is not a JSON object with a non-empty string id and type",
    name="stripe",
    guard=StripeWebhookSignatureGuard,
    build_verifier=_verifier,
    queue=QueueName.WEBHOOK_STRIPE,
    signature_headers={HEADER: "t=<unix time>,v1=<HMAC-SHA256 of '<t>.<body>' keyed by the whsec_ secret>"},
)
