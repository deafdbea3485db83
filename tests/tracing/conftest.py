"""Traces: real API and worker processes exporting to an OTLP/HTTP receiver on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.stubs.otlp_receiver import OtlpReceiver, ReceivedSpan


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture
def traced_env(settings_env: dict[str, str], otlp: OtlpReceiver) -> dict[str, str]:
    """The app's environment with tracing on, every span exported within a tenth of a second."""
    return {
        **settings_env,
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "LOG_FORMAT": "json",
    }


def tree(spans: list[ReceivedSpan]) -> str:
    """A trace drawn as its spans' tree (service, name), children under their parent: what a failure shows."""
    by_parent: dict[str, list[ReceivedSpan]] = {}
    ids = {span.span_id for span in spans}
    for span in spans:
        by_parent.setdefault(span.parent_span_id if span.parent_span_id in ids else "", []).append(span)
    lines: list[str] = []

    def draw(parent: str, depth: int) -> None:
        for span in by_parent.get(parent, []):
            lines.append(f"{'  ' * depth}{span.name} [{span.service}, {span.kind}]")
            draw(span.span_id, depth + 1)

    draw("", 0)
    return "\n".join(lines)
