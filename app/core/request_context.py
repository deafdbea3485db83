"""Request id on every line written while a request runs, and one access line per request."""

from __future__ import annotations

import logging
import time
import uuid

import structlog
from litestar.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)
_HEADER = b"x-request-id"


def _incoming_request_id(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == _HEADER and 0 < len(value) <= 128:
            return value.decode("latin-1")
    return None


def request_context_middleware(app: ASGIApp) -> ASGIApp:
    """Pure ASGI (no per-request objects): the intake path is hot."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        request_id = _incoming_request_id(scope) or uuid.uuid4().hex
        started = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), (_HEADER, request_id.encode("latin-1"))]
            await send(message)

        # bind/reset rather than bound_contextvars, which copies the whole context twice per request.
        tokens = structlog.contextvars.bind_contextvars(request_id=request_id)
        try:
            await app(scope, receive, send_with_id)
        finally:
            logger.info(
                "%s %s %s",
                scope.get("method"),
                scope["path"],
                status,
                extra={"status": status, "duration_ms": round((time.perf_counter() - started) * 1000, 2)},
            )
            structlog.contextvars.reset_contextvars(**tokens)

    return middleware
