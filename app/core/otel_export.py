"""What leaves the process in a span: scrubbed on its way to the exporter (docs/operations.md, traces).

OpenTelemetry's SDK has no hook between a span's last attribute and its
export, so the SDK's own OTLP exporter is wrapped: each span handed to it
(in the batch processor's thread, off the request and job paths) is rebuilt
only when it needs to be, with

- every configured secret removed from its name, attributes, events, links
  and status (the log scrubber's rules, ``Settings.secret_values``);
- URLs without their query string (``url.full``, ``http.url``,
  ``http.target``; ``url.query`` dropped): Stripe's and Clerk's list calls put
  their parameters there;
- a database error's message and stack left out (Postgres quotes the value it
  refused); its type stays.

The same texts come back span after span (a statement's SQL, a route, a
service name): each is scrubbed once and remembered (a bounded cache), which
makes the scrubbing a dictionary look-up for nearly every attribute.

Request bodies, event payloads and SQL parameter values are never recorded in
the first place: no instrumentation here captures bodies, asyncpg's records
the statement text only, redis' replaces every argument with ``?``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Link, Status

from app.core.redaction import SecretScrubber

URL_ATTRIBUTES = frozenset({"url.full", "http.url", "http.target"})
DROPPED_ATTRIBUTES = frozenset({"url.query"})
_DB_ERROR_KEPT = frozenset({"exception.type", "exception.escaped"})
_REMEMBERED_TEXTS = 4096
Scrub = Callable[[str], str]


class ScrubbingExporter(SpanExporter):
    """The SDK's exporter, handed scrubbed spans."""

    def __init__(self, inner: SpanExporter, scrubber: SecretScrubber) -> None:
        self.inner = inner
        self.text: Scrub = functools.lru_cache(maxsize=_REMEMBERED_TEXTS)(scrubber.text)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.inner.export([scrubbed(span, self.text) for span in spans])

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def scrubbed(span: ReadableSpan, text: Scrub) -> ReadableSpan:
    """The span itself when nothing in it needs removing (nearly always), else a copy without it."""
    attributes = _attributes(span.attributes, text)
    database = "db.system" in attributes or "db.system.name" in attributes
    events = [_event(event, text, database) for event in span.events]
    links = [_link(link, text) for link in span.links]
    name = text(span.name)
    status = span.status
    if status.description:
        description = None if database else text(status.description)
        status = Status(status.status_code, description)
    unchanged = (
        name == span.name
        and attributes == dict(span.attributes or {})
        and all(new is old for new, old in zip(events, span.events, strict=True))
        and all(new is old for new, old in zip(links, span.links, strict=True))
        and status is span.status
    )
    if unchanged:
        return span
    return ReadableSpan(
        name=name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=attributes,
        events=events,
        links=links,
        kind=span.kind,
        status=status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def _attributes(attributes: Mapping[str, Any] | None, text: Scrub) -> dict[str, Any]:
    kept: dict[str, Any] = {}
    for key, value in (attributes or {}).items():
        if key in DROPPED_ATTRIBUTES:
            continue
        if key in URL_ATTRIBUTES and isinstance(value, str):
            value = value.partition("?")[0]
        kept[key] = _value(value, text)
    return kept


def _value(value: Any, text: Scrub) -> Any:
    if isinstance(value, str):
        return text(value)
    if isinstance(value, tuple | list) and any(isinstance(item, str) for item in value):
        return tuple(text(item) if isinstance(item, str) else item for item in value)
    return value


def _event(event: Event, text: Scrub, database: bool) -> Event:
    attributes = dict(event.attributes or {})
    if database and event.name == "exception":
        attributes = {key: value for key, value in attributes.items() if key in _DB_ERROR_KEPT}
    cleaned = _attributes(attributes, text)
    if cleaned == dict(event.attributes or {}):
        return event
    return Event(event.name, cleaned, event.timestamp)


def _link(link: Link, text: Scrub) -> Link:
    cleaned = _attributes(link.attributes, text)
    return link if cleaned == dict(link.attributes or {}) else Link(link.context, cleaned)
