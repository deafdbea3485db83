"""A SaaS developer's own POST route beside the webhook routes: not a webhook route, and held to the same rules.

The webhook rate limit counts the webhook routes only (a developer's route is
neither limited by it nor spends its budget), and a JSON body nested too deep
for the decoder is a 400 on a developer's route too, never a 5xx.
"""

from __future__ import annotations

from typing import Any

from app.core.request_body import TOO_DEEP
from app.testing.deliveries import signed_stripe_delivery, stripe_event
from tests.webhook_routes import NOTES

UNHANDLED = {"id": "po_1", "object": "payout"}  # acknowledged and dropped: only the limiter is measured


async def test_the_webhook_rate_limit_counts_the_webhook_routes_only(
    make_client: Any, webhook_secrets: dict[str, str]
) -> None:
    client = await make_client(extra_modules=(NOTES,), WEBHOOK_RATE_LIMIT_PER_MINUTE="3")
    delivery = signed_stripe_delivery(stripe_event("payout.paid", UNHANDLED), webhook_secrets["stripe"])

    notes = [await client.post("/notes/7/pin", json={"text": "hello"}) for _ in range(5)]
    webhooks = [
        await client.post("/webhooks/stripe", content=delivery.body, headers=delivery.headers) for _ in range(4)
    ]
    after = await client.post("/notes/7/pin", json={"text": "again"})

    assert [response.status_code for response in notes] == [202] * 5
    assert [response.status_code for response in webhooks] == [200, 200, 200, 429]
    assert after.status_code == 202


async def test_a_body_nested_too_deep_is_a_400_on_a_developers_route(make_client: Any) -> None:
    client = await make_client(extra_modules=(NOTES,))
    for depth in (1_000, 10_000):
        body = b'{"text": "x", "deep": ' + b"[" * depth + b"]" * depth + b"}"
        response = await client.post("/notes/7/pin", content=body, headers={"Content-Type": "application/json"})
        assert (response.status_code, response.json()["detail"]) == (400, TOO_DEEP)
