"""What the OpenAPI document (``GET /schema``) says of each webhook route: headers, body and every answer.

Documentation only: the route declares no body parameter, so Litestar neither
parses nor validates the body; the signature guard reads it raw and verifies
the exact bytes, then checks what a body schema below describes (400 when it
does not hold). A schema-driven client or fuzzer learns from it why a signed
``{}`` is answered 400. Each provider says what its body carries
(``WebhookProvider.body_schema``, ``body_refused``); one that says nothing is
documented as a JSON object.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from litestar.enums import ParamType
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import OpenAPIFormat, OpenAPIType, Operation, Parameter, RequestBody, Schema
from litestar.openapi.spec import OpenAPIMediaType as MediaTypeObject

from app.webhooks.providers.base import JsonSchema, WebhookProvider


@dataclass
class Received:
    """The answer to a delivery that was stored, was already stored, or has a type nobody handles."""

    received: bool = True


@dataclass
class ErrorAnswer:
    """Litestar's error body: the status again and what to do about it."""

    status_code: int
    detail: str


ANY_BODY = Schema(type=OpenAPIType.OBJECT, description="The event as the provider sends it (a JSON object).")


def _error(description: str) -> ResponseSpec:
    return ResponseSpec(data_container=ErrorAnswer, description=description, generate_examples=False)


def responses(provider: WebhookProvider) -> dict[int, ResponseSpec]:
    """Every status the route can answer."""
    refused = provider.body_refused
    return {
        200: ResponseSpec(data_container=Received, description="Received."),
        400: _error(f"Missing, wrong, garbled or stale signature, or {refused}: nothing stored."),
        408: _error("The body did not arrive within 10 s: nothing stored."),
        413: _error("The body is over WEBHOOK_MAX_BODY_BYTES: nothing stored."),
        429: _error("Over WEBHOOK_RATE_LIMIT_PER_MINUTE for this client: deliver again after Retry-After seconds."),
        503: _error("The event could not be stored (Postgres unavailable): deliver it again later."),
    }


def schema(described: JsonSchema) -> Schema:
    """A provider's JSON Schema (OpenAPI's names: ``minLength``...) as Litestar's ``Schema`` (``min_length``)."""
    fields: dict[str, Any] = {}
    for key, value in described.items():
        name = re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()
        if name == "type":
            value = OpenAPIType(value)
        elif name == "format":
            value = OpenAPIFormat(value)
        elif name == "properties":
            value = {field: schema(inner) for field, inner in value.items()}
        elif name == "items":
            value = schema(value)
        elif name in ("one_of", "any_of", "all_of"):
            value = [schema(inner) for inner in value]
        fields[name] = value
    return Schema(**fields)


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
    body_schema = schema(provider.body_schema) if provider.body_schema else ANY_BODY
    body = RequestBody(
        required=True,
        description="Verified against the exact bytes received (the signature headers), then checked as described.",
        content={"application/json": MediaTypeObject(schema=body_schema)},
    )

    @dataclass
    class WebhookOperation(Operation):
        def __post_init__(self) -> None:
            self.parameters = [*headers, *(self.parameters or [])]
            self.request_body = body

    return WebhookOperation
