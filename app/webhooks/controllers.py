"""``POST /webhooks/<provider>``: one route per enabled provider, thin; the order of checks is docs/behaviour.md's.

The provider's signature guard reads and verifies the body (404 for a
provider switched off comes first: it has no route); the handler asks the
intake service what became of the delivery and answers. Every status a route
can answer is in the OpenAPI document (``GET /schema``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from litestar import Request, Response, post
from litestar.enums import ParamType
from litestar.exceptions import ServiceUnavailableException, TooManyRequestsException
from litestar.handlers import HTTPRouteHandler
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import OpenAPIMediaType as MediaTypeObject
from litestar.openapi.spec import OpenAPIType, Operation, Parameter, RequestBody, Schema

from app.webhooks.guards import WebhookSignatureGuard, verified_delivery
from app.webhooks.intake import IntakeOutcome, WebhookIntake
from app.webhooks.providers.base import WebhookProvider

RECEIVED = b'{"received":true}'


@dataclass
class Received:
    """The answer to a delivery that was stored, was already stored, or has a type nobody handles."""

    received: bool = True


@dataclass
class ErrorAnswer:
    """Litestar's error body: the status again and what to do about it."""

    status_code: int
    detail: str


def _error(description: str) -> ResponseSpec:
    return ResponseSpec(data_container=ErrorAnswer, description=description, generate_examples=False)


_RESPONSES = {
    400: _error("Missing, wrong, garbled or stale signature, or a body that is not a JSON object: nothing stored."),
    408: _error("The body did not arrive within 10 s: nothing stored."),
    413: _error("The body is over WEBHOOK_MAX_BODY_BYTES: nothing stored."),
    429: _error("Over WEBHOOK_RATE_LIMIT_PER_MINUTE for this client: deliver again after Retry-After seconds."),
    503: _error("The event could not be stored (Postgres unavailable): deliver it again later."),
}


_STRING = Schema(type=OpenAPIType.STRING)


def _operation(provider: WebhookProvider) -> type[Operation]:
    """The route's OpenAPI operation: the provider's signature headers and a JSON object body."""
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
        description="The event as the provider sends it (a JSON object); verified against the exact bytes.",
        content={"application/json": MediaTypeObject(schema=Schema(type=OpenAPIType.OBJECT))},
    )

    @dataclass
    class WebhookOperation(Operation):
        def __post_init__(self) -> None:
            self.parameters = [*headers, *(self.parameters or [])]
            self.request_body = body

    return WebhookOperation


def webhook_route(intake: WebhookIntake, guard: WebhookSignatureGuard, max_body_bytes: int) -> HTTPRouteHandler:
    provider = intake.provider

    async def receive(request: Request[Any, Any, Any]) -> Response[bytes]:
        decision = await intake.receive(verified_delivery(request))
        if decision.outcome is IntakeOutcome.RATE_LIMITED:
            raise TooManyRequestsException(
                detail=f"Rate limit of {intake.limiter.limit} requests per minute exceeded for this client.",
                headers={"Retry-After": str(decision.retry_after)},
            )
        if decision.outcome is IntakeOutcome.UNAVAILABLE:
            raise ServiceUnavailableException(detail="The event could not be stored; deliver it again later.")
        return Response(RECEIVED, media_type="application/json")

    return post(
        f"/webhooks/{provider.name}",
        name=f"webhook-{provider.name}",
        status_code=200,
        guards=[guard],
        request_max_body_size=max_body_bytes,
        summary=f"Receive a signed {provider.name} webhook",
        description="Verified, rate-limited per client, stored once in the inbox and queued for processing.",
        responses={200: ResponseSpec(data_container=Received, description="Received."), **_RESPONSES},
        operation_class=_operation(provider),
        tags=["webhooks"],
    )(receive)
