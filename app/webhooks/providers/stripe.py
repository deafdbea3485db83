"""Stripe: ``Stripe-Signature`` verified by the stripe package, several secrets for rotation.

The SDK checks the HMAC and rejects old timestamps; the header is checked here
first for what the SDK does not refuse by itself: non-ASCII values (its
``hmac.compare_digest`` raises ``TypeError``), oversized headers, a missing or
non-numeric timestamp, and a timestamp more than 300 s in the future.

One route takes both payload styles of Stripe's event destinations, signed
alike (each destination has its own secret: every configured one is tried):
snapshot events (``"object": "event"``, the changed object in ``data``) and
thin events (``"object": "v2.core.event"``, ``v1.``-prefixed types, naming the
changed object in ``related_object``). A thin event is verified as the SDK's
``StripeClient.parse_event_notification`` verifies it (the same
``WebhookSignature.verify_header``) and read by the one JSON decoding intake
and worker share (``decode_payload``), not into the SDK's notification
objects: the worker reads the stored dict. A thin event of a handled type must
name its related object's ``id`` and ``type`` (:func:`check_thin_event`), the
only thing a worker can read back from it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from app.core.lazy_import import lazy_module
from app.core.settings import Settings
from app.queue.queues import QueueName
from app.webhooks.jobs import ProcessWebhookEventJob
from app.webhooks.providers.base import (
    EventEnvelope,
    Headers,
    JsonSchema,
    PayloadError,
    SignatureError,
    VerifiedEvent,
    Verifier,
    WebhookProvider,
    check_event_field,
    event_key_schema,
    signature_header,
)

if TYPE_CHECKING:
    import stripe
else:  # imported with its first use: an API that gets no Stripe delivery never verifies one (app/core/lazy_import.py)
    stripe = lazy_module("stripe")

TOLERANCE_SECONDS = 300
HEADER = "Stripe-Signature"
ENVELOPE = EventEnvelope()


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
        return ENVELOPE.read(body, headers)

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


THIN_EVENT_OBJECT = "v2.core.event"
"""The ``object`` of a thin event (an event destination's thin payload); a snapshot event's is ``event``."""
THIN_TYPE_PREFIX = "v1."
"""Thin events about API v1 resources are named after the snapshot types with this prefix."""


def is_thin_event(event_type: str, payload: Mapping[str, Any]) -> bool:
    return payload.get("object") == THIN_EVENT_OBJECT or event_type.startswith(THIN_TYPE_PREFIX)


def check_thin_event(event: VerifiedEvent) -> None:
    """A thin event of a handled type names what changed: ``related_object`` with a string ``id`` and ``type``.

    Read from the payload as the inbox stores it (a NUL in it is U+FFFD already, ``VerifiedEvent``): its id
    becomes a key, so it must fit one (at most 255 characters) or the event is refused here (400).
    """
    if not is_thin_event(event.event_type, event.payload):
        return
    related = event.payload.get("related_object")
    if not isinstance(related, Mapping):
        raise PayloadError(
            f"The thin event {event.event_type} has no related_object (an object with its id and type): "
            "nothing says what changed."
        )
    for name in ("id", "type"):
        check_event_field(name, related.get(name), holder="The thin event's related_object")


_STRING: JsonSchema = {"type": "string"}
SNAPSHOT_BODY: JsonSchema = {
    "type": "object",
    "title": "StripeSnapshotEvent",
    "description": "A snapshot event (a webhook endpoint, or an event destination sending snapshot payloads).",
    "properties": {
        "object": {"type": "string", "const": "event"},
        "created": {"type": "integer", "description": "Unix time of the event."},
        "data": {
            "type": "object",
            "description": "``data.object``: what the event is about (its customer is read again from Stripe).",
            "properties": {"object": {"type": "object"}},
        },
    },
}
THIN_BODY: JsonSchema = {
    "type": "object",
    "title": "StripeThinEvent",
    "description": (
        "A thin event (an event destination sending thin payloads): a v1.-prefixed type naming the changed object, "
        "which the worker reads from Stripe. v2.core.event_destination.ping is answered 200 and not stored."
    ),
    "required": ["object", "related_object"],
    "properties": {
        "object": {"type": "string", "const": THIN_EVENT_OBJECT},
        "created": {"type": "string", "format": "date-time", "description": "RFC 3339 time of the event."},
        "related_object": {
            "type": "object",
            "description": "What changed: required, with a string id and type, for every handled type (else 400).",
            "required": ["id", "type"],
            "properties": {
                "id": event_key_schema("The changed object's id (sub_..., in_..., dp_...)."),
                "type": event_key_schema("Its Stripe type (subscription, invoice, dispute...)."),
                "url": _STRING,
            },
        },
        "snapshot_event": {
            "type": "string",
            "description": "The snapshot event of the same change, when one was sent too.",
        },
    },
}
BODY: JsonSchema = {
    "type": "object",
    "title": "StripeEvent",
    "description": (
        "A Stripe event as Stripe sends it, in either payload style, stored as sent once its signature verifies."
    ),
    "required": ["id", "type"],
    "properties": {
        "id": event_key_schema("The event's id (evt_...): the inbox's key, so a redelivery is stored once."),
        "type": event_key_schema(
            "customer.subscription.updated, v1.invoice.paid...: a type no module handles is answered 200."
        ),
    },
    "oneOf": [SNAPSHOT_BODY, THIN_BODY],
    "examples": [
        {"id": "evt_1", "object": "event", "type": "invoice.paid", "data": {"object": {"customer": "cus_1"}}},
        {
            "id": "evt_2",
            "object": THIN_EVENT_OBJECT,
            "type": "v1.invoice.paid",
            "created": "2026-10-01T12:00:00.000Z",
            "related_object": {"id": "in_1", "type": "invoice", "url": "/v1/invoices/in_1"},
        },
    ],
}

STRIPE = WebhookProvider(
    body_schema=BODY,
    body_refused=(
        "a body that is not a JSON object with a non-empty string id and type, or a thin event of a handled type "
        "without a related_object naming its id and type"
    ),
    name="stripe",
    build_verifier=_verifier,
    queue=QueueName.WEBHOOK_STRIPE,
    signature_headers={HEADER: "t=<unix time>,v1=<HMAC-SHA256 of '<t>.<body>' keyed by the whsec_ secret>"},
    check_handled_body=check_thin_event,
)


class ProcessStripeEventJob(ProcessWebhookEventJob, provider=STRIPE):
    """Stripe's events, on ``webhook-stripe-queue``: never behind another provider's."""
