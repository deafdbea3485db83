"""The Stripe types intake keeps and the types billing syncs are one list, written in two modules."""

from __future__ import annotations

from app.billing.handlers import _ROUTES
from app.webhooks.providers.stripe import HANDLED_TYPES


def test_intake_keeps_exactly_the_stripe_types_billing_routes() -> None:
    """A type kept but not routed is stored and never synced; routed but not kept, it is dropped at intake."""
    routed = {f"{pattern}*" if pattern.endswith(".") else pattern for pattern, _ in _ROUTES}
    assert routed == set(HANDLED_TYPES)
