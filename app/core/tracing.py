"""Traces (docs/operations.md, traces): the one door to OpenTelemetry, free when it is off.

Tracing is on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set: :func:`start`
then imports :mod:`app.core.otel`, which sets up OpenTelemetry's SDK from its
own variables. Unset, no ``opentelemetry`` module is ever imported and every
function here returns at once (one check of a module global): the hot paths
call them unconditionally.

A delivery is one trace. The context travels as the request id does: a job
carries the context of whoever queued it (``trace_context`` in its envelope,
W3C headers as a JSON object), an inbox event keeps its delivery's with its
row, and a re-queue of the event (an operator's retry, the recovery cron)
names the stored one, so each attempt is a span of the delivery's trace.
"""

from __future__ import annotations

import contextlib
import enum
import json
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias

if TYPE_CHECKING:
    from app.core.otel import Tracing
    from app.core.settings import Settings

Role = Literal["api", "worker", "cli"]
SpanKindName = Literal["internal", "producer", "consumer"]
AttributeValue: TypeAlias = str | int | float | bool

_tracing: Tracing | None = None
NOT_TRACED: Final = contextlib.nullcontext()
"""What every block's context manager is when tracing is off: one shared object that does nothing."""
# The Litestar plugin module imports OpenTelemetry when it is itself imported, and Litestar imports it while
# building any app, to see whether its plugin is in use: kept out of a process that does not trace.
_LITESTAR_PLUGIN = "litestar.plugins.opentelemetry"
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")


class _Current(enum.Enum):
    TRACE = "the span running now"


CURRENT_TRACE: Final = _Current.TRACE
"""The default trace context of a queued job: the one of the code that queues it."""
JobTraceContext: TypeAlias = str | Literal[_Current.TRACE] | None
"""The trace a job continues: a stored context, ``None`` (a trace of its own) or :data:`CURRENT_TRACE`."""


def requested(settings: Settings) -> bool:
    """Whether this deployment traces: an OTLP endpoint is set (and the SDK is not switched off)."""
    return bool(settings.otel_exporter_otlp_endpoint) and not settings.otel_sdk_disabled


def is_on() -> bool:
    return _tracing is not None


def start(settings: Settings, role: Role) -> bool:
    """Set up the SDK for this process (``role`` names its default service) when requested; whether it is on.

    Idempotent: the first call decides. Call it before the process makes its first HTTP client.
    """
    global _tracing
    if _tracing is not None:
        return True
    if not requested(settings):
        return False
    from app.core.otel import Tracing

    _tracing = Tracing.start(settings, role)
    return True


def shutdown() -> None:
    """Export what is buffered (within the exporter's timeout), then stop: a stopping process loses no span."""
    if _tracing is not None:
        _tracing.shutdown()


def server_plugins(settings: Settings) -> list[Any]:
    """Litestar's own OpenTelemetry plugin (the requests' server spans) when requested; else nothing.

    When tracing is off, Litestar's plugin module is marked absent so that building the app does not import
    OpenTelemetry (Litestar treats it as not installed).
    """
    if not requested(settings):
        sys.modules.setdefault(_LITESTAR_PLUGIN, None)  # type: ignore[arg-type]
        return []
    from app.core.otel import litestar_plugin

    return [litestar_plugin()]


def current_trace_context() -> str | None:
    """The running span's context as a job or an inbox row carries it; None when off or outside any span."""
    return None if _tracing is None else _tracing.carrier()


def trace_id_of(trace_context: str | None) -> str | None:
    """The trace id (32 hex digits) a stored context names, for people to search their tracing backend with."""
    if not trace_context:
        return None
    try:
        headers = json.loads(trace_context)
    except ValueError:
        return None
    found = _TRACEPARENT.match(str(headers.get("traceparent", ""))) if isinstance(headers, dict) else None
    return found.group(1) if found else None


def current_trace_id() -> str | None:
    """The running span's trace id (a Sentry tag); None when off or outside any span."""
    return None if _tracing is None else _tracing.trace_id()


def span(
    name: str,
    kind: SpanKindName = "internal",
    attributes: Mapping[str, AttributeValue] | None = None,
    *,
    covers_its_calls: bool = False,
) -> contextlib.AbstractContextManager[Any]:
    """A span around a block, child of the running one.

    ``covers_its_calls``: the span says all there is of the block's Redis, SQL and HTTP calls (an enqueue is one
    script call, a budget wait its polling), which then make no spans of their own: each span costs the process
    about 0.25 ms of CPU, its export included (docs/operations.md, traces).
    """
    return NOT_TRACED if _tracing is None else _tracing.span(name, kind, attributes, covers_its_calls)


def traced_wait(name: str) -> contextlib.AbstractContextManager[Any]:
    """A wait as a span of its own (the Stripe budget, an upstream hold): ``with traced_wait("stripe budget"):``.

    Its span is named ``wait for <name>``; a trace then shows where the time went.
    """
    return NOT_TRACED if _tracing is None else _tracing.span(f"wait for {name}", "internal", None, True)


def job_attempt(
    name: str, *, queue: str, job_id: str, attempt: int, trace_context: str | None
) -> contextlib.AbstractContextManager[Any]:
    """One try of a job: a consumer span named after its class, continuing the trace it was queued in."""
    if _tracing is None:
        return NOT_TRACED
    return _tracing.job_attempt(name, queue=queue, job_id=job_id, attempt=attempt, trace_context=trace_context)


def resumed(trace_context: str | None, name: str) -> contextlib.AbstractContextManager[Any]:
    """A span ``name`` in the stored context's trace (an inbox event's), linked to the running one.

    What is queued inside belongs to the event's trace: an operator's retry shows in the delivery's story.
    """
    if _tracing is None or not trace_context:
        return NOT_TRACED
    return _tracing.resumed(trace_context, name)


def annotate(attributes: Mapping[str, AttributeValue | None], *, linked: str | None = None) -> None:
    """Attributes (those not None) on the running span: which inbox event, subject or tenant it works for.

    ``linked``: a stored context (the event's) the span links to when it runs in another trace.
    """
    if _tracing is not None:
        _tracing.annotate(attributes, linked)


def link_traces(trace_contexts: Iterable[str | None]) -> None:
    """Link the running span to each stored context's trace (a sync to the events it covers)."""
    if _tracing is not None:
        _tracing.link(trace_contexts)


def add_trace_ids(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    """structlog processor: ``trace_id`` and ``span_id`` on every line written while a span is active."""
    if _tracing is not None:
        _tracing.add_ids(event)
    return event


def quiet() -> contextlib.AbstractContextManager[Any]:
    """No instrumentation's spans in a block and the tasks it starts (a worker's polling, its relay rounds).

    A job's attempt starts from its stored context alone, so its own SQL, Redis and HTTP spans are recorded.
    """
    return NOT_TRACED if _tracing is None else _tracing.quiet()


@contextlib.contextmanager
def command_span(settings: Settings, name: str) -> Iterator[None]:
    """A command's run: tracing started for it (service ``saas-jobs-cli``), one root span, flushed at the end."""
    if not start(settings, "cli"):
        yield
        return
    try:
        with span(name):
            yield
    finally:
        shutdown()
