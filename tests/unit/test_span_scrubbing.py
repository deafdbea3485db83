"""What a span may carry out of the process: scrubbed on its way to the exporter (app/core/otel_export.py)."""

from __future__ import annotations

import json
from collections.abc import Callable

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Tracer

from app.core.otel_export import ScrubbingExporter
from app.core.redaction import SecretScrubber
from app.core.tracing import trace_id_of

SECRET = "sk_live_never_exported_42"


def _exported(record: Callable[[Tracer], None]) -> ReadableSpan:
    memory = InMemorySpanExporter()
    provider = TracerProvider()  # not the global one: this process traces nothing else
    provider.add_span_processor(SimpleSpanProcessor(ScrubbingExporter(memory, SecretScrubber([SECRET]))))
    record(provider.get_tracer("test"))
    (span,) = memory.get_finished_spans()
    return span


def test_a_secret_anywhere_in_a_span_and_a_urls_query_string_do_not_leave() -> None:
    def record(tracer: Tracer) -> None:
        with tracer.start_as_current_span(f"GET {SECRET}", kind=SpanKind.CLIENT) as span:
            span.set_attribute("url.full", f"https://api.stripe.com/v1/subscriptions?customer=cus_1&key={SECRET}")
            span.set_attribute("url.query", "customer=cus_1")
            span.set_attribute("app.values", ["plain", f"with {SECRET}"])
            span.add_event("retry", {"why": f"Bearer {SECRET}"})

    span = _exported(record)
    assert SECRET not in json.dumps(json.loads(span.to_json()))
    assert span.attributes is not None and span.attributes["url.full"] == "https://api.stripe.com/v1/subscriptions"
    assert "url.query" not in span.attributes and span.attributes["app.values"] == ("plain", "with [Filtered]")


def test_a_database_errors_message_does_not_leave_its_type_does() -> None:
    def record(tracer: Tracer) -> None:
        with tracer.start_as_current_span("INSERT", kind=SpanKind.CLIENT) as span:
            span.set_attribute("db.system", "postgresql")
            try:
                raise ValueError('invalid input syntax for type integer: "card-4242"')
            except ValueError as exc:
                span.record_exception(exc)

    (event,) = _exported(record).events
    assert dict(event.attributes or {}) == {"exception.type": "ValueError", "exception.escaped": "False"}


def test_a_span_with_nothing_to_remove_is_exported_as_it_is() -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("test").start_as_current_span("POST /webhooks/clerk") as span:
        span.set_attribute("http.response.status_code", 200)
    (original,) = memory.get_finished_spans()
    exporter = InMemorySpanExporter()
    ScrubbingExporter(exporter, SecretScrubber([SECRET])).export([original])
    assert exporter.get_finished_spans()[0] is original


def test_the_trace_id_of_a_stored_context_is_what_backends_search_by() -> None:
    stored = '{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}'
    assert trace_id_of(stored) == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert trace_id_of(None) is None and trace_id_of("not json") is None and trace_id_of('{"b3": "x"}') is None
