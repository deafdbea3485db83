"""What a webhook provider is: how it verifies, what its deliveries are signed with, what it handles.

Adding a provider is one new file defining a :class:`WebhookProvider` and one
line in ``app/webhooks/providers/__init__.py``. Everything a provider file
needs is importable from here; one with a queue of its own also declares its
job there, in one line, from ``app/webhooks/jobs.py``
(``class ProcessStripeEventJob(ProcessWebhookEventJob, provider=STRIPE)``).
Which of its event types are handled is said by the module that handles them
(its ``webhook_handlers``), not here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from app.core.settings import Settings
from app.queue.queues import QueueName
from app.webhooks.payload import MAX_FIELD_CHARS, check_event_field
from app.webhooks.verification import (
    MAX_SIGNATURE_HEADER_BYTES,
    Headers,
    PayloadError,
    SignatureError,
    VerifiedEvent,
    Verifier,
    decode_payload,
    signature_header,
)

if TYPE_CHECKING:  # the guard is the API's: the worker, which loads the providers for their queues, loads no Litestar
    from app.webhooks.guards import WebhookSignatureGuard

JsonSchema = Mapping[str, Any]
"""A JSON Schema as the OpenAPI document writes it (``type``, ``properties``, ``minLength``...)."""

__all__ = [
    "MAX_FIELD_CHARS",
    "MAX_SIGNATURE_HEADER_BYTES",
    "EventEnvelope",
    "Headers",
    "JsonSchema",
    "PayloadError",
    "SignatureError",
    "VerifiedEvent",
    "Verifier",
    "WebhookProvider",
    "check_event_field",
    "decode_payload",
    "event_key_schema",
    "signature_header",
]


def event_key_schema(what: str) -> JsonSchema:
    """An event id or type in a body schema: the intake refuses (400) anything but a non-empty string without NUL."""
    return {"type": "string", "minLength": 1, "maxLength": MAX_FIELD_CHARS, "description": what}


@dataclass(frozen=True)
class EventEnvelope:
    """Where a provider's deliveries carry their event's id and type: the id in the body (``id_field``) or in a
    signed header (``id_header``), the type in the body (``type_field``)."""

    id_field: str = "id"
    type_field: str = "type"
    id_header: str | None = None

    def read(self, body: bytes, headers: Headers) -> VerifiedEvent:
        """The event in a body whose signature verified: decoded as intake and worker decode it, its id and type
        checked as inbox keys, else :class:`PayloadError` (400, nothing stored)."""
        payload = decode_payload(body)
        event_id = headers.get(self.id_header) if self.id_header else payload.get(self.id_field)
        return VerifiedEvent.of(event_id, payload.get(self.type_field), payload, body)


@dataclass(frozen=True)
class WebhookProvider:
    name: str
    """Route segment (``/webhooks/<name>``) and the ``provider`` column."""

    build_verifier: Callable[[Settings], Verifier | None]
    """Returns the verifier for these settings, or ``None`` when the provider is switched off (404)."""

    signature_headers: Mapping[str, str] = field(default_factory=dict)
    """The headers its deliveries are signed with, and what each holds (for the OpenAPI document)."""

    guard: type[WebhookSignatureGuard] | None = None
    """The route's signature guard class, built from the verifier (None: ``WebhookSignatureGuard``)."""

    body_schema: JsonSchema | None = None
    """What a valid delivery's body carries, for the OpenAPI document (None: any JSON object)."""

    body_refused: str = "a body that is not a JSON object"
    """What in a signed body is answered 400, for that answer's description in the OpenAPI document."""

    queue: str = QueueName.WEBHOOK
    """The queue of its events' jobs: a provider's own never waits behind another's, and its file declares the job
    that runs there (``ProcessWebhookEventJob``). A name the starter does not list (``app/queue/queues.py``) is
    declared by the webhooks module, which runs the job."""

    check_handled_body: Callable[[VerifiedEvent], None] | None = None
    """What a verified body of a type a loaded module handles must carry beyond an id and a type
    (:class:`PayloadError`: 400, nothing stored); run by the route's verifier (``checking_handled``)."""
