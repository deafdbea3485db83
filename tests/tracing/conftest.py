"""Traces: real API and worker processes exporting to an OTLP/HTTP receiver on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from app.core.resources import Resources
from app.testing import signed_stripe_delivery, stripe_event, stripe_subscription
from app.testing.deliveries import Delivery
from app.testing.stripe_stub import StripeStub
from tests.factories import WorkspaceFactory, persist
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


def tree(spans: list[ReceivedSpan], *, durations: bool = False) -> str:
    """A trace drawn as its spans' tree (service, name), children under their parent in the order they started:
    what a failure shows (and, with their durations, docs/operations.md)."""
    by_parent: dict[str, list[ReceivedSpan]] = {}
    ids = {span.span_id for span in spans}
    for span in spans:
        by_parent.setdefault(span.parent_span_id if span.parent_span_id in ids else "", []).append(span)
    for children in by_parent.values():
        children.sort(key=lambda span: span.start_ns)
    lines: list[str] = []

    def draw(parent: str, depth: int) -> None:
        for span in by_parent.get(parent, []):
            took = f" {(span.end_ns - span.start_ns) / 1e6:.1f} ms" if durations else ""
            lines.append(f"{'  ' * depth}{span.name} [{span.service}, {span.kind}]{took}")
            draw(span.span_id, depth + 1)

    draw("", 0)
    return "\n".join(lines)


async def linked_customer(resources: Resources, stripe_stub: StripeStub, customer: str, **fields: Any) -> None:
    """A workspace linked to Stripe customer ``customer``, which the Stripe stub has (with ``fields``)."""
    await persist(resources.db, WorkspaceFactory.build(stripe_customer_id=customer))
    stripe_stub.put_customer(customer, **fields)


def subscription_delivery(secret: str, customer: str, **subscription: Any) -> Delivery:
    """A signed ``customer.subscription.updated`` delivery about ``customer``'s subscription."""
    event = stripe_event("customer.subscription.updated", stripe_subscription(customer, **subscription))
    return signed_stripe_delivery(event, secret)
