"""`make dev` with its generated Stripe key talks to the local Stripe stub (`make stripe-stub`), never to Stripe."""

from __future__ import annotations

import os

import pytest

from tools.dev import DEV_STRIPE_API_KEY, STRIPE_STUB_PORT, use_local_stripe


@pytest.mark.parametrize(
    ("key", "base", "expected"),
    [
        (DEV_STRIPE_API_KEY, None, f"http://127.0.0.1:{STRIPE_STUB_PORT}"),  # the generated key: the local stub
        (DEV_STRIPE_API_KEY, "http://127.0.0.1:9999", "http://127.0.0.1:9999"),  # a base given: kept
        ("sk_test_a_real_one", None, None),  # a real key: Stripe's own (the setting's default)
    ],
)
def test_the_generated_key_points_the_stripe_api_at_the_local_stub(
    monkeypatch: pytest.MonkeyPatch, key: str, base: str | None, expected: str | None
) -> None:
    monkeypatch.setenv("STRIPE_API_KEY", key)
    if base is None:
        monkeypatch.delenv("STRIPE_API_BASE", raising=False)
    else:
        monkeypatch.setenv("STRIPE_API_BASE", base)

    use_local_stripe()

    assert os.environ.get("STRIPE_API_BASE") == expected
