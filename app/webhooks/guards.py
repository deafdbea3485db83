"""The signature guard of a webhook route: reads the body once, verifies it, refuses what does not verify.

It runs after routing, as the route's ``before_request`` hook, so a
switched-off provider (no route) answers 404 whatever the body
(docs/behaviour.md, step 1); not as a Litestar ``guards=`` entry, for which
Litestar copies the route handler on every request (4% of the intake's CPU).
Then, in that page's order: the body is read within ``BODY_TIMEOUT_SECONDS``
and ``WEBHOOK_MAX_BODY_BYTES`` (408, 413), and the provider's verifier checks
the signature over the exact bytes and parses the body once (400). What passes
is left on the request for the route handler; every refusal is logged
(throttled) and none is an error of ours: no 5xx, no Sentry event.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, cast

from litestar import Request
from litestar.exceptions import ClientException, HTTPException, InternalServerException

from app.webhooks.client_ip import Network, client_ip, forwarded_for
from app.webhooks.refusals import Refusal, RefusalLog
from app.webhooks.verification import PayloadError, SignatureError, VerifiedEvent, Verifier

logger = logging.getLogger(__name__)
BODY_TIMEOUT_SECONDS = 10.0
_STATE_KEY = "webhook_delivery"


@dataclass(frozen=True, slots=True)
class VerifiedDelivery:
    """What the guard leaves for the route handler: the verified event and who sent it."""

    event: VerifiedEvent
    client: str
    body: bytes


class ClientGoneError(HTTPException):
    """The client disconnected before its body arrived: nobody to answer, nothing to report."""

    status_code = 400


def verified_delivery(request: Request[Any, Any, Any]) -> VerifiedDelivery:
    return cast(VerifiedDelivery, request.scope["state"][_STATE_KEY])


class WebhookSignatureGuard:
    """The route's guard (its ``before_request`` hook), built from one provider's verifier (subclassed per provider
    for its name)."""

    def __init__(
        self,
        provider: str,
        verify: Verifier,
        *,
        trusted_proxies: Sequence[Network],
        refusals: RefusalLog,
        body_timeout: float = BODY_TIMEOUT_SECONDS,
    ) -> None:
        self.provider = provider
        self.verify = verify
        self.trusted_proxies = trusted_proxies
        self.refusals = refusals
        self.body_timeout = body_timeout

    async def __call__(self, request: Request[Any, Any, Any]) -> None:
        client = self.client_of(request)
        body = await self._read_body(request, client)
        try:
            event = self.verify(body, request.headers)
        except SignatureError as exc:
            self._refuse(Refusal.SIGNATURE, client, str(exc))
        except PayloadError as exc:
            self._refuse(Refusal.PAYLOAD, client, str(exc))
        request.scope["state"][_STATE_KEY] = VerifiedDelivery(event, client, body)

    def client_of(self, request: Request[Any, Any, Any]) -> str:
        # uvicorn runs with --no-proxy-headers in every entry point: TRUSTED_PROXIES alone decides here.
        peer = request.client.host if request.client else None
        lines = request.headers.getall("x-forwarded-for", []) if self.trusted_proxies else []
        return client_ip(peer, forwarded_for(lines), self.trusted_proxies)

    async def _read_body(self, request: Request[Any, Any, Any], client: str) -> bytes:
        try:
            async with asyncio.timeout(self.body_timeout):
                return await request.body()
        except TimeoutError:
            detail = f"The body was not received within {self.body_timeout:g} s."
            self.refusals.record(self.provider, Refusal.PAYLOAD, client, detail)
            raise HTTPException(status_code=408, detail=detail, headers={"Connection": "close"}) from None
        except ClientException as exc:  # 413: over WEBHOOK_MAX_BODY_BYTES, by Content-Length or as streamed
            self.refusals.record(self.provider, Refusal.TOO_LARGE, client, str(exc.detail))
            raise
        except InternalServerException:  # Litestar's "client disconnected prematurely"
            logger.info("A %s delivery from %s disconnected before its body arrived.", self.provider, client)
            raise ClientGoneError(detail="The client disconnected before the body arrived.") from None

    def _refuse(self, reason: Refusal, client: str, detail: str) -> NoReturn:
        self.refusals.record(self.provider, reason, client, detail)
        raise ClientException(detail=detail)
