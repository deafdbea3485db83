"""Clerk: svix headers verified by the svix package; the event id is the ``svix-id``."""

from __future__ import annotations

from svix.webhooks import Webhook, WebhookVerificationError

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

HANDLED_TYPES = ("user.*", "organization.*", "organizationMembership.*")
SVIX_HEADERS = ("svix-id", "svix-timestamp", "svix-signature")


def _verifier(settings: Settings) -> Verifier | None:
    if not settings.clerk_webhook_signing_secret:
        return None
    webhook = Webhook(settings.clerk_webhook_signing_secret)

    def verify(body: bytes, headers: Headers) -> VerifiedEvent:
        present = {name: headers.get(name) or "" for name in SVIX_HEADERS}
        missing = [name for name, value in present.items() if not value]
        if missing:
            raise SignatureError(f"Missing {', '.join(missing)} header(s).")
        try:
            webhook.verify(body, present)  # returns None in svix 2.9: parse the JSON ourselves
        except (WebhookVerificationError, ValueError):
            # svix raises ValueError for a signature entry without a comma
            raise SignatureError(
                "Clerk (svix) signature does not match, or its timestamp is more than 5 minutes off. "
                "Check CLERK_WEBHOOK_SIGNING_SECRET."
            ) from None
        return _parse(body, present["svix-id"])

    return verify


def _parse(body: bytes, svix_id: str) -> VerifiedEvent:
    _, event_type = parse_event_head(body)
    if not isinstance(event_type, str) or not event_type:
        raise PayloadError("A Clerk event needs a string 'type' field.")
    return VerifiedEvent(event_id=svix_id, event_type=event_type)


CLERK = WebhookProvider(name="clerk", build_verifier=_verifier, handles=type_matcher(*HANDLED_TYPES))
