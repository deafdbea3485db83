"""OpenTelemetry set up from its own variables: the only module that imports it (through :mod:`app.core.tracing`).

The SDK reads ``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_HEADERS``,
``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``,
``OTEL_BSP_*``... itself; this module adds only what the project decides:

- a service name after the process's role (``saas-jobs-api``, ``-worker``,
  ``-cli``) and ``deployment.environment`` from ``APP_ENV``, unless those
  variables name them;
- OTLP over HTTP behind a batch span processor, each span scrubbed on its way
  out (``app.core.otel_export``);
- the instrumentations: asyncpg (every statement, the inbox's own included:
  they run on the pool's driver connections, which SQLAlchemy's instrumentation
  never sees, and SQLAlchemy's asyncpg dialect runs through the same driver, so
  one instrumentation and one span per statement), redis and httpx (the
  Stripe and Clerk SDKs' clients);
- a client span with no parent (a worker's polling, a relay round) starts no
  trace: only requests, jobs, commands and enqueues do;
- HTTP spans in the stable conventions (``http.request.method``, ``url.full``,
  ``http.response.status_code``) unless ``OTEL_SEMCONV_STABILITY_OPT_IN`` says otherwise.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from litestar.plugins.opentelemetry import OpenTelemetryConfig, OpenTelemetryPlugin
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.instrumentation.redis import RedisInstrumentor
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanContext, SpanKind
from opentelemetry.util.types import Attributes

from app.core.otel_export import ScrubbingExporter
from app.core.redaction import SENSITIVE_HEADERS, SecretScrubber
from app.core.settings import Settings

# Probes and scrapes are not stories: no trace each (every few seconds, from every prober).
UNTRACED_PATHS = [r"^/(health|ready|metrics)$"]
_KINDS = {"internal": SpanKind.INTERNAL, "producer": SpanKind.PRODUCER, "consumer": SpanKind.CONSUMER}
_MAX_LINKS = 100


def _prefer_stable_http_conventions() -> None:
    os.environ.setdefault("OTEL_SEMCONV_STABILITY_OPT_IN", "http")


def litestar_plugin() -> OpenTelemetryPlugin:
    """Litestar's plugin: one server span per request, from the global provider (set by :meth:`Tracing.start`)."""
    _prefer_stable_http_conventions()
    config = OpenTelemetryConfig(
        exclude=UNTRACED_PATHS,
        exclude_spans=["receive", "send"],
        # Headers are recorded only if OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_* ask for them: credentials never.
        http_capture_headers_sanitize_fields=sorted(SENSITIVE_HEADERS),
    )
    return OpenTelemetryPlugin(config)


class NoOrphanClients(Sampler):
    """The configured sampler (``OTEL_TRACES_SAMPLER``), but a client span with no parent is dropped."""

    def __init__(self, configured: Sampler) -> None:
        self.configured = configured

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        if kind is SpanKind.CLIENT and not trace.get_current_span(parent_context).get_span_context().is_valid:
            return SamplingResult(Decision.DROP)
        return self.configured.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def get_description(self) -> str:
        return f"NoOrphanClients{{{self.configured.get_description()}}}"


def _resource(role: str, app_env: str) -> Resource:
    """What the variables say, with the role's service name and ``APP_ENV`` where they say nothing."""
    detected = Resource.create()
    defaults: dict[str, str] = {}
    if str(detected.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        defaults[SERVICE_NAME] = f"saas-jobs-{role}"
    if "deployment.environment" not in detected.attributes:
        defaults["deployment.environment"] = app_env
    return detected.merge(Resource(defaults))


def _headers(trace_context: str | None) -> dict[str, str]:
    """A stored context back to the propagators' headers; anything unreadable is no context."""
    if not trace_context:
        return {}
    try:
        headers = json.loads(trace_context)
    except ValueError:
        return {}
    if not isinstance(headers, dict):
        return {}
    return {str(key): value for key, value in headers.items() if isinstance(value, str)}


def _stored(trace_context: str | None) -> Context:
    """The stored context as a fresh one: nothing of the running context (suppression, baggage) carried over."""
    return propagate.extract(_headers(trace_context), context=Context())


def _span_context(trace_context: str | None) -> SpanContext | None:
    found = trace.get_current_span(_stored(trace_context)).get_span_context()
    return found if found.is_valid else None


class Tracing:
    """The process's tracer provider and the operations :mod:`app.core.tracing` offers when tracing is on."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("app")

    @classmethod
    def start(cls, settings: Settings, role: str) -> Tracing:
        _prefer_stable_http_conventions()
        resource = _resource(role, settings.app_env)
        configured = TracerProvider(resource=resource, shutdown_on_exit=False).sampler  # the variables' sampler
        provider = TracerProvider(resource=resource, sampler=NoOrphanClients(configured))
        scrubber = SecretScrubber(settings.secret_values())
        provider.add_span_processor(BatchSpanProcessor(ScrubbingExporter(OTLPSpanExporter(), scrubber)))
        trace.set_tracer_provider(provider)
        AsyncPGInstrumentor().instrument(tracer_provider=provider)
        RedisInstrumentor().instrument(tracer_provider=provider)
        HTTPXClientInstrumentor().instrument(tracer_provider=provider)
        return cls(provider)

    def shutdown(self) -> None:
        self.provider.shutdown()

    def carrier(self) -> str | None:
        headers: dict[str, str] = {}
        propagate.inject(headers)
        return json.dumps(headers, separators=(",", ":"), sort_keys=True) if headers else None

    def trace_id(self) -> str | None:
        found = trace.get_current_span().get_span_context()
        return format(found.trace_id, "032x") if found.is_valid else None

    def add_ids(self, event: dict[str, Any]) -> None:
        found = trace.get_current_span().get_span_context()
        if found.is_valid:
            event["trace_id"] = format(found.trace_id, "032x")
            event["span_id"] = format(found.span_id, "016x")

    @contextmanager
    def span(
        self, name: str, kind: str, attributes: Mapping[str, Any] | None, covers_its_calls: bool
    ) -> Iterator[None]:
        with self.tracer.start_as_current_span(name, kind=_KINDS[kind], attributes=attributes):
            if covers_its_calls:
                with suppress_instrumentation():
                    yield
            else:
                yield

    @contextmanager
    def job_attempt(
        self, name: str, *, queue: str, job_id: str, attempt: int, trace_context: str | None
    ) -> Iterator[None]:
        """Started from the stored context alone: a worker's polling runs with its instrumentation suppressed."""
        token = otel_context.attach(_stored(trace_context))
        try:
            attributes: dict[str, str | int] = {
                "messaging.system": "arq",
                "messaging.operation.type": "process",
                "messaging.destination.name": queue,
                "messaging.message.id": job_id,
                "job.attempt": attempt,
            }
            with self.tracer.start_as_current_span(name, kind=SpanKind.CONSUMER, attributes=attributes):
                yield
        finally:
            otel_context.detach(token)

    @contextmanager
    def resumed(self, trace_context: str, name: str) -> Iterator[None]:
        here = trace.get_current_span().get_span_context()
        links = [Link(here)] if here.is_valid else []
        with self.tracer.start_as_current_span(name, context=_stored(trace_context), links=links):
            yield

    def annotate(self, attributes: Mapping[str, Any], linked: str | None) -> None:
        current = trace.get_current_span()
        if current.is_recording():
            current.set_attributes({key: value for key, value in attributes.items() if value is not None})
            self.link([linked])

    def link(self, trace_contexts: Iterable[str | None]) -> None:
        current = trace.get_current_span()
        if not current.is_recording():
            return
        seen = {current.get_span_context().trace_id}
        for trace_context in trace_contexts:
            found = _span_context(trace_context)
            if found is not None and found.trace_id not in seen and len(seen) <= _MAX_LINKS:
                seen.add(found.trace_id)
                current.add_link(found)

    @staticmethod
    def quiet() -> Any:
        """Instrumentation off for a block and the tasks it starts (a worker's polling); a job turns it back on."""
        return suppress_instrumentation()
