"""What the OpenAPI document (``GET /schema``) says of each webhook route: headers, body and every answer.

Documentation only: the route declares no body parameter, so Litestar neither
parses nor validates the body; the signature guard reads it raw and verifies
the exact bytes, then checks what a body schema below describes (400 when it
does not hold). A schema-driven client or fuzzer learns from it why a signed
``{}`` is answered 400. A provider with no body schema here is documented as a
JSON object.
"""

from __future__ import annotations

from dataclasses import dataclass

from litestar.enums import ParamType
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import OpenAPIMediaType as MediaTypeObject
from litestar.openapi.spec import OpenAPIType, Operation, Parameter, RequestBody, Schema

from app.webhooks.payload import MAX_FIELD_CHARS
from app.webhooks.providers.base import WebhookProvider


@dataclass
class Received:
    """The answer to a delivery that was stored, was already stored, or has a type nobody handles."""

    received: bool = True


@dataclass
class ErrorAnswer:
    """Litestar's error body: the status again and what to do about it."""

    status_code: int
    detail: str


def _key(what: str) -> Schema:
    """An event id or type: what the intake refuses (400) unless it is a non-empty string without NUL."""
    return Schema(type=OpenAPIType.STRING, min_length=1, max_length=MAX_FIELD_CHARS, description=what)


_OBJECT = Schema(type=OpenAPIType.OBJECT)
_STRIPE_EVENT = Schema(
    type=OpenAPIType.OBJECT,
    title="StripeEvent",
    description="A Stripe event as Stripe sends it, stored as sent once its signature verifies.",
    required=["id", "type"],
    properties={
        "id": _key("The event's id (evt_...): the inbox's key, so a redelivery is stored once."),
        "type": _key("customer.subscription.updated, invoice.paid...: a type no module handles is answered 200."),
        "object": Schema(type=OpenAPIType.STRING, const="event"),
        "created": Schema(type=OpenAPIType.INTEGER, description="Unix time of the event."),
        "data": Schema(
            type=OpenAPIType.OBJECT,
            description="``data.object``: what the event is about (its customer is read again from Stripe).",
            properties={"object": _OBJECT},
        ),
    },
    examples=[{"id": "evt_1", "object": "event", "type": "invoice.paid", "data": {"object": {"customer": "cus_1"}}}],
)
_CLERK_EVENT = Schema(
    type=OpenAPIType.OBJECT,
    title="ClerkEvent",
    description="A Clerk event as Clerk sends it (through Svix); its id is the svix-id header.",
    required=["type", "data"],
    properties={
        "type": _key("user.created, organization.updated, organizationMembership.deleted..."),
        "data": Schema(
            type=OpenAPIType.OBJECT,
            description="The user, organization or membership as Clerk has it (for a deletion, its id).",
        ),
        "object": Schema(type=OpenAPIType.STRING, const="event"),
        "timestamp": Schema(type=OpenAPIType.INTEGER, description="Unix milliseconds: a deletion's time."),
    },
    examples=[{"object": "event", "type": "user.deleted", "timestamp": 1750000000000, "data": {"id": "user_1"}}],
)


@dataclass(frozen=True)
class _Body:
    schema: Schema
    refused: str
    """What in a signed body is answered 400, for that answer's description."""


_BODIES = {
    "stripe": _Body(_STRIPE_EVENT, "a body that is not a JSON object with a non-empty string id and type"),
    "clerk": _Body(_CLERK_EVENT, "a body that is not a JSON object with a non-empty string type"),
}
_ANY_BODY = _Body(
    Schema(type=OpenAPIType.OBJECT, description="The event as the provider sends it (a JSON object)."),
    "a body that is not a JSON object",
)


def _error(description: str) -> ResponseSpec:
    return ResponseSpec(data_container=ErrorAnswer, description=description, generate_examples=False)


def responses(provider: WebhookProvider) -> dict[int, ResponseSpec]:
    """Every status the route can answer."""
    refused = _BODIES.get(provider.name, _ANY_BODY).refused
    return {
        200: ResponseSpec(data_container=Received, description="Received."),
        400: _error(f"Missing, wrong, garbled or stale signature, or {refused}: nothing stored."),
        408: _error("The body did not arrive within 10 s: nothing stored."),
        413: _error("The body is over WEBHOOK_MAX_BODY_BYTES: nothing stored."),
        429: _error("Over WEBHOOK_RATE_LIMIT_PER_MINUTE for this client: deliver again after Retry-After seconds."),
        503: _error("The event could not be stored (Postgres unavailable): deliver it again later."),
    }


def operation_class(provider: WebhookProvider) -> type[Operation]:
    """The route's operation, given the provider's signature headers and body schema."""
    headers = [
        Parameter(
            name=name,
            param_in=ParamType.HEADER,
            required=True,
            description=what,
            schema=Schema(type=OpenAPIType.STRING),
        )
        for name, what in provider.signature_headers.items()
    ]
    body = RequestBody(
        required=True,
        description="Verified against the exact bytes received (the signature headers), then checked as described.",
        content={"application/json": MediaTypeObject(schema=_BODIES.get(provider.name, _ANY_BODY).schema)},
    )

    @dataclass
    class WebhookOperation(Operation):
        def __post_init__(self) -> None:
            self.parameters = [*headers, *(self.parameters or [])]
            self.request_body = body

    return WebhookOperation
