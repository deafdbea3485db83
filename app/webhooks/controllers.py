"""``POST /webhooks/<provider>``: one route per enabled provider, thin; the order of checks is docs/behaviour.md's.

The provider's signature guard reads and verifies the body (404 for a
provider switched off comes first: it has no route); the handler asks the
intake service what became of the delivery and answers. Every status a route
can answer, and what a valid body carries, is in the OpenAPI document
(``GET /schema``, ``openapi.py``).
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post
from litestar.exceptions import ServiceUnavailableException, TooManyRequestsException
from litestar.handlers import HTTPRouteHandler

from app.webhooks.guards import WebhookSignatureGuard, verified_delivery
from app.webhooks.intake import IntakeOutcome, WebhookIntake
from app.webhooks.openapi import operation_class, responses

RECEIVED = b'{"received":true}'


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
        before_request=guard,
        request_max_body_size=max_body_bytes,
        summary=f"Receive a signed {provider.name} webhook",
        description="Verified, rate-limited per client, stored once in the inbox and queued for processing.",
        responses=responses(provider),
        operation_class=operation_class(provider),
        tags=["webhooks"],
    )(receive)
