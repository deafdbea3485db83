"""What a webhook provider is: how it verifies, what its deliveries are signed with, what it handles.

Adding a provider is one new file defining a :class:`WebhookProvider` and one
line in ``app/webhooks/providers/__init__.py``. Everything a provider file
needs is importable from here. Which of its event types are handled is said by
the module that handles them (its ``webhook_handlers``), not here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from litestar.openapi.spec import OpenAPIFormat, OpenAPIType, Schema

from app.core.settings import Settings
from app.queue.queues import QueueName
from app.webhooks.guards import WebhookSignatureGuard
from app.webhooks.payload import MAX_FIELD_CHARS
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

__all__ = [
    "MAX_FIELD_CHARS",
    "MAX_SIGNATURE_HEADER_BYTES",
    "Headers",
    "OpenAPIFormat",
    "OpenAPIType",
    "PayloadError",
    "Schema",
    "SignatureError",
    "VerifiedEvent",
    "Verifier",
    "WebhookProvider",
    "WebhookSignatureGuard",
    "decode_payload",
    "event_key_schema",
    "signature_header",
]


def event_key_schema(what: str) -> Schema:
    """An event id or type in a body schema: the intake refuses (400) anything but a non-empty string without NUL."""
    return Schema(type=OpenAPIType.STRING, min_length=1, max_length=MAX_FIELD_CHARS, description=what)


@dataclass(frozen=True)
class WebhookProvider:
    name: str
    """Route segment (``/webhooks/<name>``) and the ``provider`` column."""

    build_verifier: Callable[[Settings], Verifier | None]
    """Returns the verifier for these settings, or ``None`` when the provider is switched off (404)."""

    signature_headers: Mapping[str, str] = field(default_factory=dict)
    """The headers its deliveries are signed with, and what each holds (for the OpenAPI document)."""

    guard: type[WebhookSignatureGuard] = WebhookSignatureGuard
    """The route's signature guard, built from the verifier (a subclass names the provider in tracebacks)."""

    body_schema: Schema | None = None
    """What a valid delivery's body carries, for the OpenAPI document (None: any JSON object)."""

    body_refused: str = "a body that is not a JSON object"
    """What in a signed body is answered 400, for that answer's description in the OpenAPI document."""

    queue: str = QueueName.WEBHOOK
    """The queue of its events' jobs: a provider's own never waits behind another's. A name the starter does not
    list (``app/queue/queues.py``) is declared by the webhooks module, which runs the job."""

    check_handled_body: Callable[[VerifiedEvent], None] | None = None
    """What a verified body of a type a loaded module handles must carry beyond an id and a type
    (:class:`PayloadError`: 400, nothing stored); run by the route's verifier (``checking_handled``)."""
