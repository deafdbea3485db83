"""``POST /webhooks/{provider}``: thin; the order of checks is SPEC section 5's."""

from __future__ import annotations

from litestar import Controller, Request, Response, post
from litestar.exceptions import (
    ClientException,
    NotFoundException,
    ServiceUnavailableException,
    TooManyRequestsException,
)
from litestar.params import FromPath

from app.webhooks.client_ip import client_ip
from app.webhooks.intake import ProviderIntake, StorageUnavailable
from app.webhooks.providers.base import PayloadError, SignatureError

RECEIVED = b'{"received":true}'


class WebhookController(Controller):
    path = "/webhooks"

    @post("/{provider:str}", status_code=200, summary="Receive a signed provider webhook")
    async def receive(self, provider: FromPath[str], request: Request) -> Response[bytes]:
        # The app's State, not an injected ``state`` parameter: Litestar copies the state into a new
        # State object for each request that asks for one (make bench, intake profile).
        state = request.app.state
        intake: ProviderIntake | None = state.webhook_intakes.get(provider)
        if intake is None:
            raise NotFoundException(detail=f"Webhook provider {provider!r} is not enabled on this server.")
        body = await request.body()  # 413 past WEBHOOK_MAX_BODY_BYTES, before anything else is read
        try:
            event = intake.verify(body, request.headers)
        except (SignatureError, PayloadError) as exc:
            raise ClientException(detail=str(exc)) from None
        # uvicorn runs with --no-proxy-headers in every entry point: TRUSTED_PROXIES alone decides here.
        peer = request.client.host if request.client else None
        client = client_ip(peer, request.headers.get("x-forwarded-for"), state.trusted_proxies)
        decision = await intake.rate_limit(client)
        if not decision.allowed:
            raise TooManyRequestsException(
                detail=f"Rate limit of {intake.limiter.limit} requests per minute exceeded for {client}.",
                headers={"Retry-After": str(decision.retry_after)},
            )
        try:
            await intake.accept(event, body)
        except StorageUnavailable:
            raise ServiceUnavailableException(detail="The event could not be stored; deliver it again later.") from None
        return Response(RECEIVED, media_type="application/json")
