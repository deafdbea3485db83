"""Each worker's own ``/metrics`` on ``WORKER_METRICS_PORT``.

prometheus_client's exposition served by its threading WSGI server, wrapped
in one check: ``Authorization: Bearer METRICS_TOKEN`` when that is set (the
library's own ``start_http_server`` has no such check). A port already taken
is one warning, and the worker runs on without metrics.
"""

from __future__ import annotations

import hmac
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client.exposition import ThreadingWSGIServer

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


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None


def metrics_app(token: str | None) -> Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]:
    expected = f"Bearer {token}".encode() if token else None

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") not in ("/metrics", "/"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"Not found: the worker serves /metrics.\n"]
        given = environ.get("HTTP_AUTHORIZATION", "").encode("latin-1")
        if expected is not None and not hmac.compare_digest(given, expected):
            start_response("401 Unauthorized", [("Content-Type", "text/plain"), ("WWW-Authenticate", "Bearer")])
            return [b"Send Authorization: Bearer <METRICS_TOKEN>.\n"]
        start_response("200 OK", [("Content-Type", CONTENT_TYPE)])
        return [exposition()]

    return app


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
    """The server thread of one worker process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._server: ThreadingWSGIServer | None = None

    def serve(self) -> None:
        port = self.settings.worker_metrics_port
        if not port:
            return
        host = "0.0.0.0" if self.settings.is_production else "127.0.0.1"
        try:
            self._server = make_server(
                host, port, metrics_app(self.settings.metrics_token), ThreadingWSGIServer, handler_class=_Quiet
            )
        except OSError as exc:
            logger.warning(
                "Worker metrics: port %d is not free (%s); this worker runs on without /metrics. Give each worker "
                "on one host its own WORKER_METRICS_PORT (0 switches it off).",
                port,
                exc,
            )
            return
        threading.Thread(target=self._server.serve_forever, name="worker metrics", daemon=True).start()
        logger.info("Worker metrics on http://%s:%d/metrics.", host, port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
