"""Each worker's own ``/metrics`` on ``WORKER_METRICS_PORT``.

A small HTTP server on the worker's event loop (no thread: a thread polling
its socket and one more per scrape cost the worker more than the exposition
itself), serving prometheus_client's exposition behind one check:
``Authorization: Bearer METRICS_TOKEN`` when that is set. A port already
taken is one warning, and the worker runs on without metrics; ``0`` serves
no port at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import socket
from collections.abc import Iterable

from app.core.metrics import (
    ATTEMPTS_FAILED,
    CONTENT_TYPE,
    EVENTS_BACKFILLED,
    EVENTS_PROCESSED,
    EVENTS_SET_ASIDE,
    JOB_RUNS,
    child,
    exposition,
)
from app.core.settings import Settings

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT_SECONDS = 5.0
_MAX_REQUEST_BYTES = 16 * 1024


def _answer(status: str, body: bytes, content_type: str = "text/plain", *extra: str) -> bytes:
    headers = [f"HTTP/1.1 {status}", f"Content-Type: {content_type}", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join([*headers, "Connection: close", "", ""])).encode("latin-1") + body


def metrics_answer(request: bytes, token: str | None) -> bytes:
    """The whole HTTP answer to one request (its request line and headers, as read)."""
    lines = request.decode("latin-1").split("\r\n")
    method, _, rest = lines[0].partition(" ")
    path = rest.partition(" ")[0].partition("?")[0]
    if method != "GET" or path not in ("/metrics", "/"):
        return _answer("404 Not Found", b"Not found: the worker serves GET /metrics.\n")
    if token:
        given = next((line[14:].strip() for line in lines[1:] if line[:14].lower() == "authorization:"), "")
        if not hmac.compare_digest(given.encode("latin-1"), f"Bearer {token}".encode()):
            return _answer(
                "401 Unauthorized",
                b"Send Authorization: Bearer <METRICS_TOKEN>.\n",
                "text/plain",
                "WWW-Authenticate: Bearer",
            )
    return _answer("200 OK", exposition(), CONTENT_TYPE)


def prime_series(job_names: Iterable[str], providers: Iterable[str]) -> None:
    """Every series this worker counts exists at 0 from its start, so an increase over one (an alert rule)
    sees its first rise: a series first scraped at 1 has no rise to see."""
    for name in job_names:
        for outcome in ("ok", "retry", "failed"):
            child(JOB_RUNS, name, outcome)
    for provider in providers:
        for metric in (EVENTS_PROCESSED, ATTEMPTS_FAILED, EVENTS_SET_ASIDE, EVENTS_BACKFILLED):
            child(metric, provider)


class WorkerMetrics:
    """The metrics server of one worker process, on its event loop (``serve`` and ``close`` run inside it)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._task: asyncio.Task[None] | None = None

    def serve(self) -> None:
        port = self.settings.worker_metrics_port
        if not port:
            return
        host = "0.0.0.0" if self.settings.is_production else "127.0.0.1"
        try:
            sock = socket.create_server((host, port))  # bound now: a port taken is known at start
        except OSError as exc:
            logger.warning(
                "Worker metrics: port %d is not free (%s); this worker runs on without /metrics. Give each worker "
                "on one host its own WORKER_METRICS_PORT (0 switches it off).",
                port,
                exc,
            )
            return
        self._task = asyncio.get_running_loop().create_task(self._run(sock), name="worker metrics")
        logger.info("Worker metrics on http://%s:%d/metrics.", host, port)

    async def _run(self, sock: socket.socket) -> None:
        server = await asyncio.start_server(self._connected, sock=sock, limit=_MAX_REQUEST_BYTES)
        async with server:
            await server.serve_forever()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()  # serve_forever closes the server (and its socket) as it ends
            self._task = None

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_SECONDS):
                request = await reader.readuntil(b"\r\n\r\n")
                writer.write(metrics_answer(request, self.settings.metrics_token))
                await writer.drain()
        except (TimeoutError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # a client gone or too slow: nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
