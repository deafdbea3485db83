"""Clerk: svix headers verified by the svix package; the event id is the ``svix-id``."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from app.core.settings import Settings
from app.queue.queues import QueueName
from app.webhooks.jobs import ProcessWebhookEventJob
from app.webhooks.providers.base import (
    EventEnvelope,
    Headers,
    JsonSchema,
    SignatureError,
    VerifiedEvent,
    Verifier,
    WebhookProvider,
    event_key_schema,
    signature_header,
)

if TYPE_CHECKING:
    from svix.webhooks import Webhook

SVIX_HEADERS = ("svix-id", "svix-timestamp", "svix-signature")
ENVELOPE = EventEnvelope(id_header="svix-id")


def _verifier(settings: Settings) -> Verifier | None:
    if not settings.clerk_webhook_signing_secret:
        return None
    secret = settings.clerk_webhook_signing_secret

    @functools.cache
    def webhook() -> Webhook:
        # Imported with the first delivery: the svix package loads its whole API client (0.4 s of CPU), which a
        # worker, a command or an API that gets no Clerk delivery has no use for.
        from svix.webhooks import Webhook

        return Webhook(secret)

    def verify(body: bytes, headers: Headers) -> VerifiedEvent:
        present = {name: signature_header(headers, name) for name in SVIX_HEADERS}
        checker = webhook()
        try:
            checker.verify(body, present)  # returns None in svix 2.9: the body is parsed below
        except Exception:
            # WebhookVerificationError, and whatever else hostile headers make svix raise (a signature
            # entry without a comma raises ValueError): every one is a signature that does not verify.
            raise SignatureError(
                "Clerk (svix) signature does not match, or its timestamp is more than 5 minutes off. "
                "Check CLERK_WEBHOOK_SIGNING_SECRET."
            ) from None
        return ENVELOPE.read(body, present)

    return verify


BODY: JsonSchema = {
    "type": "object",
    "title": "ClerkEvent",
    "description": "A Clerk event as Clerk sends it (through Svix); its id is the svix-id header.",
    "required": ["type", "data"],
    "properties": {
        "type": event_key_schema("user.created, organization.updated, organizationMembership.deleted..."),
        "data": {
            "type": "object",
            "description": "The user, organization or membership as Clerk has it (for a deletion, its id).",
        },
        "object": {"type": "string", "const": "event"},
        "timestamp": {"type": "integer", "description": "Unix milliseconds: a deletion's time."},
    },
    "examples": [{"object": "event", "type": "user.deleted", "timestamp": 1750000000000, "data": {"id": "user_1"}}],
}

CLERK = WebhookProvider(
    body_schema=BODY,
    body_refused="a body that is not a JSON object with a non-empty string type",
    name="clerk",
    build_verifier=_verifier,
    queue=QueueName.WEBHOOK_CLERK,
    signature_headers={
        "svix-id": "the message id, the same on every retry: the inbox's event id",
        "svix-timestamp": "unix time of the attempt (5 minutes of tolerance, both ways)",
        "svix-signature": "space-separated v1,<base64 HMAC> entries, one per signing secret",
    },
)


class ProcessClerkEventJob(ProcessWebhookEventJob, provider=CLERK):
    """Clerk's events, on ``webhook-clerk-queue``: never behind another provider's."""
