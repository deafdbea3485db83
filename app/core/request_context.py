"""Request id on every line written while a request runs, and one access line per request.

The id is also kept in :data:`REQUEST_ID`, so what a request queues or stores
can carry it on (``current_request_id``): a job queued during a request logs
every line with the request's id, and an inbox event remembers the id of the
delivery that stored it (docs/operations.md, correlation).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import re
import time
import uuid
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Final, Literal, TypeAlias

import structlog

if TYPE_CHECKING:  # the worker imports this module too, and loads no Litestar
    from litestar.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)
_HEADER = b"x-request-id"
REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)


def current_request_id() -> str | None:
    """The id of the request (or of the job that a request queued) this code runs for, if any."""
    return REQUEST_ID.get()


class _Current(enum.Enum):
    REQUEST = "the request or job running now"


CURRENT_REQUEST: Final = _Current.REQUEST
"""The default ``request_id`` of a queued job: the id of the request (or job) that queues it."""
JobRequestId: TypeAlias = str | Literal[_Current.REQUEST] | None
"""The request a job is queued for: an id, ``None`` (none), or :data:`CURRENT_REQUEST`."""


def request_id_for_job(choice: JobRequestId) -> str | None:
    """The id a job queued with ``choice`` carries: a job that re-queues an inbox event names the event's own."""
    return current_request_id() if choice is CURRENT_REQUEST else choice


_ACCEPTED = re.compile(rb"[A-Za-z0-9._:@/+=-]{1,128}")


def _incoming_request_id(scope: Scope) -> str | None:
    """A proxy's id, kept when it looks like one: anything else (spaces, quotes, control bytes) would be
    written into every log line and stored with the event, so a fresh id replaces it."""
    for name, value in scope.get("headers", ()):
        if name == _HEADER and _ACCEPTED.fullmatch(value):
            return value.decode("ascii")
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
        token = REQUEST_ID.set(request_id)
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
            REQUEST_ID.reset(token)

    return middleware


@contextlib.contextmanager
def bound_request_id(request_id: str | None) -> Iterator[None]:
    """Outside a request (a job, a processing attempt): lines written meanwhile carry ``request_id``."""
    if not request_id:
        yield
        return
    token = REQUEST_ID.set(request_id)
    with structlog.contextvars.bound_contextvars(request_id=request_id):
        try:
            yield
        finally:
            REQUEST_ID.reset(token)
