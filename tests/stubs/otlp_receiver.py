"""An OTLP/HTTP trace receiver: a real HTTP server on loopback decoding ``ExportTraceServiceRequest``.

Point ``OTEL_EXPORTER_OTLP_ENDPOINT`` at :attr:`endpoint`; read the spans that
arrived from :attr:`spans` (one :class:`ReceivedSpan` each, ids in hex as
backends show them). :meth:`sent_bytes` gives every request body as it arrived
(decompressed), so a test can look for a string anywhere in what was exported.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.stubs.post_server import Answer, PostServer

KINDS = {Span.SPAN_KIND_SERVER: "server", Span.SPAN_KIND_CLIENT: "client", Span.SPAN_KIND_PRODUCER: "producer"}
KINDS |= {Span.SPAN_KIND_CONSUMER: "consumer", Span.SPAN_KIND_INTERNAL: "internal"}


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    service: str
    attributes: dict[str, Any]
    links: list[str] = field(default_factory=list)  # the trace ids linked to
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    status: int = 0  # 0 unset, 1 ok, 2 error
    start_ns: int = 0
    end_ns: int = 0

    def __getitem__(self, key: str) -> Any:
        return self.attributes[key]


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, which) if which else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _spans(request: ExportTraceServiceRequest) -> list[ReceivedSpan]:
    found = []
    for resource_spans in request.resource_spans:
        service = str(_attributes(resource_spans.resource.attributes).get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                found.append(
                    ReceivedSpan(
                        name=span.name,
                        kind=KINDS.get(span.kind, "unspecified"),
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        service=service,
                        attributes=_attributes(span.attributes),
                        links=[link.trace_id.hex() for link in span.links],
                        events=[(event.name, _attributes(event.attributes)) for event in span.events],
                        status=span.status.code,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                    )
                )
    return found


class OtlpReceiver:
    """Export traces to :attr:`endpoint` (``OTEL_EXPORTER_OTLP_ENDPOINT``); each arrival wakes :meth:`wait_for`."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.resources: list[dict[str, Any]] = []
        self.bodies: list[bytes] = []
        self._arrived = threading.Condition()
        self._server = PostServer(self._receive)

    def _receive(self, path: str, body: bytes) -> Answer:
        if path != "/v1/traces":
            return 404, "text/plain", b""
        self._ingest(body)
        return 200, "application/x-protobuf", ExportTraceServiceResponse().SerializeToString()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.port}"

    def start(self) -> OtlpReceiver:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def _ingest(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self._arrived:
            self.bodies.append(body)
            self.spans.extend(_spans(request))
            self.resources.extend(_attributes(each.resource.attributes) for each in request.resource_spans)
            self._arrived.notify_all()

    def wait_for(
        self, predicate: Callable[[list[ReceivedSpan]], Any], timeout: float = 30.0, what: str = "the spans"
    ) -> Any:
        """Until ``predicate(spans)`` is truthy (its value is returned); AssertionError after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while True:
                found = predicate(list(self.spans))
                if found:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    names = sorted({(span.service, span.name) for span in self.spans})
                    raise AssertionError(f"timed out after {timeout} s waiting for {what}; received {names}")
                self._arrived.wait(left)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._arrived:
            return [span for span in self.spans if span.trace_id == trace_id]

    def sent_bytes(self) -> bytes:
        with self._arrived:
            return b"\n".join(self.bodies)
