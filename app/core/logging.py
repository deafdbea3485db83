"""One logger set-up for the API, the worker and the commands.

structlog renders every line, including lines of the standard library's
loggers (arq, uvicorn, SQLAlchemy), so context bound with
``structlog.contextvars`` (request id, job name, job id...) lands on all of them, and so do
``trace_id`` and ``span_id`` while a span is active (docs/operations.md, traces).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import msgspec
import structlog
from structlog.tracebacks import ExceptionDictTransformer

from app.core.redaction import MIN_SECRET_LENGTH, SecretScrubber
from app.core.settings import Settings
from app.core.tracing import add_trace_ids

logger = logging.getLogger(__name__)
_NOISY = {
    "uvicorn.access": logging.WARNING,
    "httpx": logging.WARNING,
    "httpcore": logging.WARNING,
    "stripe": logging.WARNING,
}


def _drop_color_message(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    event.pop("color_message", None)  # uvicorn's duplicate of the message, with ANSI codes
    return event


def _shared_processors() -> list[Any]:
    return [
        structlog.contextvars.merge_contextvars,
        add_trace_ids,  # while a span is active (tracing on): one check of a global otherwise
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.ExtraAdder(),
        _drop_color_message,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]


_json_encoder = msgspec.json.Encoder(enc_hook=repr)


def _dumps(event: dict[str, Any], **_: Any) -> str:
    """msgspec renders a line in a third of ``json.dumps``' time; anything it refuses goes the slow way."""
    try:
        return _json_encoder.encode(event).decode()
    except (TypeError, ValueError):
        return json.dumps(event, default=repr)


def _exception_renderer(fmt: str) -> Any:
    """Tracebacks become data (or text) before the line is rendered and scrubbed, and never show frame locals.

    Locals hold the settings (API keys, webhook secrets) and request bodies, and made one
    failing request's line tens of kilobytes (structlog's dict tracebacks and Rich show them).
    """
    if fmt == "json":
        return structlog.processors.ExceptionRenderer(ExceptionDictTransformer(show_locals=False))
    return structlog.processors.ExceptionRenderer()  # the plain text Python itself prints


class _Scrubbed:
    """The renderer, then the rendered line searched for every configured secret: the last step of each line.

    Whatever a value is (a string, a container, an exception, any object a renderer
    prints through its repr or encodes field by field), a secret that slipped into it
    is removed from the text the line ends up as, in every form a renderer writes it
    (escaped in a JSON string or a repr). One search of the line with one compiled
    pattern: a line with no secret (nearly all) costs just that, a few microseconds.
    Left out of the chain when no secret is configured.
    """

    def __init__(self, render: Any, scrubber: SecretScrubber) -> None:
        self.render = render
        self.scrubber = scrubber

    def __call__(self, logger: Any, name: str, event: MutableMapping[str, Any]) -> str:
        return self.scrubber.text(self.render(logger, name, event))


def _renderer(fmt: str) -> Any:
    if fmt == "json":
        return structlog.processors.JSONRenderer(serializer=_dumps)
    # The exception is already text by now; plain_traceback only stands in for Rich's, which shows locals.
    return structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty(), exception_formatter=structlog.dev.plain_traceback)


def _skip_unused_record_fields() -> None:
    """The logging module's documented optimisations: no line shows the caller, thread or process.

    Each line on the hot paths (the access line, a job's lines) costs about a
    quarter less without them (make bench).
    """
    logging._srcfile = None  # the caller's frame (funcName, lineno)
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


def configure_logging(settings: Settings) -> None:
    """Idempotent: the API factory, the worker and tests may all call it.

    It warns about each secret too short to be scrubbed (by its variable's name, never its value).
    """
    shared = _shared_processors()
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    render = _renderer(settings.log_format)
    scrubber = SecretScrubber(settings.secret_values(), written=True)
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            _exception_renderer(settings.log_format),
            _Scrubbed(render, scrubber) if scrubber else render,
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    _skip_unused_record_fields()
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(settings.log_level)
    for name, level in _NOISY.items():
        logging.getLogger(name).setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "arq"):
        logging.getLogger(name).handlers = []
        logging.getLogger(name).propagate = True
    for variable in settings.secrets_too_short_to_scrub():
        logger.warning(
            "%s holds a secret shorter than %d characters, too short to tell from ordinary text: it is not "
            "scrubbed from log lines and Sentry events. Set a longer one.",
            variable,
            MIN_SECRET_LENGTH,
        )
