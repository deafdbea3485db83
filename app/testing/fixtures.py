"""The test kit's pytest fixtures, as a plugin: add ``pytest_plugins = ["app.testing.fixtures"]`` to your
top-level ``conftest.py`` (or import the fixtures you need into a conftest).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.testing.clerk_stub import ClerkStub, clerk_stub_fixture
from app.testing.stripe_stub import StripeStub, stripe_stub_fixture

__all__ = ["clerk_stub", "clerk_stub_server", "stripe_stub", "stripe_stub_server"]


@pytest.fixture(scope="session")
def stripe_stub_server() -> Iterator[StripeStub]:
    """One stub server per test process: starting and stopping one costs ~0.2 s, a reset almost nothing."""
    yield from stripe_stub_fixture()


@pytest.fixture
def stripe_stub(stripe_stub_server: StripeStub) -> StripeStub:
    """The Stripe API stub, empty: no objects, faults or recorded requests left by an earlier test.

    Point the app at it with ``STRIPE_API_BASE=stripe_stub.base_url`` (and any ``STRIPE_API_KEY``
    starting with ``sk_``); put state with ``stripe_stub.put_subscription(...)``; schedule faults with
    ``fail``, ``rate_limit`` and ``slow``.
    """
    stripe_stub_server.reset()
    return stripe_stub_server


@pytest.fixture(scope="session")
def clerk_stub_server() -> Iterator[ClerkStub]:
    yield from clerk_stub_fixture()


@pytest.fixture
def clerk_stub(clerk_stub_server: ClerkStub) -> ClerkStub:
    """The Clerk Backend API stub, empty. Point the app at it with ``CLERK_API_BASE=clerk_stub.base_url + "/v1"``
    and any ``CLERK_SECRET_KEY`` starting with ``sk_``; put objects with ``put_user``, ``put_organization``,
    ``put_membership``; ``remove`` one to make it deleted in Clerk."""
    clerk_stub_server.reset()
    return clerk_stub_server
