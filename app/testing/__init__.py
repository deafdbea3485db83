"""The test kit for handlers and jobs: signed deliveries, the Stripe API stub, the pipeline helpers.

Everything is importable from here (``from app.testing import deliver_and_wait, signed_stripe_delivery``);
each name loads its submodule on first use, so building a delivery never pulls in
the stub server's web stack. The pytest fixtures are a plugin:
``pytest_plugins = ["app.testing.fixtures"]``. Guide: the README, "Test your handlers".
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names as re-exports, for type checkers and editors
    from app.testing.clerk_stub import ClerkStub as ClerkStub
    from app.testing.clerk_stub import clerk_stub_fixture as clerk_stub_fixture
    from app.testing.deliveries import STRIPE_API_VERSION as STRIPE_API_VERSION
    from app.testing.deliveries import Delivery as Delivery
    from app.testing.deliveries import clerk_event as clerk_event
    from app.testing.deliveries import generate_whsec as generate_whsec
    from app.testing.deliveries import random_id as random_id
    from app.testing.deliveries import signed_clerk_delivery as signed_clerk_delivery
    from app.testing.deliveries import signed_stripe_delivery as signed_stripe_delivery
    from app.testing.deliveries import stripe_event as stripe_event
    from app.testing.deliveries import stripe_object as stripe_object
    from app.testing.deliveries import stripe_subscription as stripe_subscription
    from app.testing.pipeline import DeliveryTimeoutError as DeliveryTimeoutError
    from app.testing.pipeline import InboxRow as InboxRow
    from app.testing.pipeline import deliver_and_wait as deliver_and_wait
    from app.testing.pipeline import process_delivery as process_delivery
    from app.testing.pipeline import provider_of as provider_of
    from app.testing.pipeline import read_inbox_row as read_inbox_row
    from app.testing.stripe_stub import StripeStub as StripeStub
    from app.testing.stripe_stub import stripe_stub_fixture as stripe_stub_fixture
    from app.testing.thin_deliveries import stripe_ping_event as stripe_ping_event
    from app.testing.thin_deliveries import stripe_thin_event as stripe_thin_event
    from app.testing.thin_deliveries import stripe_thin_twin as stripe_thin_twin

_SUBMODULES = {
    "deliveries": (
        "STRIPE_API_VERSION",
        "Delivery",
        "clerk_event",
        "generate_whsec",
        "random_id",
        "signed_clerk_delivery",
        "signed_stripe_delivery",
        "stripe_event",
        "stripe_object",
        "stripe_subscription",
    ),
    "thin_deliveries": ("stripe_ping_event", "stripe_thin_event", "stripe_thin_twin"),
    "pipeline": (
        "DeliveryTimeoutError",
        "InboxRow",
        "deliver_and_wait",
        "process_delivery",
        "provider_of",
        "read_inbox_row",
    ),
    "stripe_stub": ("StripeStub", "stripe_stub_fixture"),
    "clerk_stub": ("ClerkStub", "clerk_stub_fixture"),
}
_WHERE = {name: module for module, names in _SUBMODULES.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'app.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"app.testing.{module}"), name)
    globals()[name] = value
    return value
