"""The OpenAPI document says what a valid delivery of each provider carries, and the routes hold to it.

The API is built with a SaaS developer's own POST route beside the webhook routes (``tests/webhook_routes.py``):
the webhook routes are found by their tag, and the developer's is not one of them.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

import stripe
from litestar.testing import AsyncTestClient
from svix.webhooks import Webhook

from app.asgi import build_app
from app.core.settings import Settings
from app.runtime import API_MODULES
from tests.webhook_routes import NOTE_PATH, NOTES, other_post_paths, webhook_operations


def request_body(document: dict[str, Any], provider: str) -> dict[str, Any]:
    body: dict[str, Any] = document["paths"][f"/webhooks/{provider}"]["post"]["requestBody"]
    assert body["required"] is True
    assert set(body["content"]) == {"application/json"}
    schema: dict[str, Any] = body["content"]["application/json"]["schema"]
    return schema


def non_empty_string(schema: dict[str, Any]) -> bool:
    return schema["type"] == "string" and schema["minLength"] == 1 and schema["maxLength"] == 255


def signed(provider: str, body: dict[str, Any], secret: str) -> tuple[bytes, dict[str, str]]:
    """Any body, signed as the provider signs it (the test kit's deliveries need an id and a type)."""
    raw = json.dumps(body).encode()
    if provider == "stripe":
        header = stripe.WebhookSignature.generate_signature_header(raw.decode(), secret, timestamp=int(time.time()))
        return raw, {"Stripe-Signature": header}
    now, message_id = datetime.now(UTC), f"msg_openapi_{time.monotonic_ns()}"
    signature = Webhook(secret).sign(message_id, now, raw.decode())
    return raw, {"svix-id": message_id, "svix-timestamp": str(int(now.timestamp())), "svix-signature": signature}


async def test_each_webhook_route_documents_its_body_and_answers_as_documented(
    settings: Settings, webhook_secrets: dict[str, str]
) -> None:
    async with AsyncTestClient(build_app(settings, [*API_MODULES, NOTES])) as client:
        document = (await client.get("/schema/openapi.json")).json()
        routes = webhook_operations(document)
        assert {route.provider for route in routes.values()} == {"stripe", "clerk"}
        assert NOTE_PATH in other_post_paths(document) and NOTE_PATH not in routes
        stripe_body, clerk_body = request_body(document, "stripe"), request_body(document, "clerk")
        assert (stripe_body["type"], stripe_body["required"]) == ("object", ["id", "type"])
        assert non_empty_string(stripe_body["properties"]["id"])
        assert non_empty_string(stripe_body["properties"]["type"])
        assert (clerk_body["type"], clerk_body["required"]) == ("object", ["type", "data"])
        assert non_empty_string(clerk_body["properties"]["type"])
        assert clerk_body["properties"]["data"]["type"] == "object"
        clerk = document["paths"]["/webhooks/clerk"]["post"]
        headers = {p["name"] for p in clerk["parameters"] if p["in"] == "header" and p["required"]}
        assert headers == {"svix-id", "svix-timestamp", "svix-signature"}
        stripe_400 = document["paths"]["/webhooks/stripe"]["post"]["responses"]["400"]["description"]
        assert "non-empty string id and type" in stripe_400
        assert "thin event of a handled type without a related_object" in stripe_400
        # Both payload styles of Stripe's event destinations: snapshot and thin.
        snapshot, thin = stripe_body["oneOf"]
        assert (snapshot["title"], snapshot["properties"]["object"]["const"]) == ("StripeSnapshotEvent", "event")
        assert (thin["title"], thin["properties"]["object"]["const"]) == ("StripeThinEvent", "v2.core.event")
        assert thin["required"] == ["object", "related_object"]
        assert thin["properties"]["related_object"]["required"] == ["id", "type"]
        assert non_empty_string(thin["properties"]["related_object"]["properties"]["id"])

        # Signed, each documented example is received; signed, a body lacking what the schema requires is not.
        examples = [("stripe", example) for example in stripe_body["examples"]]
        examples += [("clerk", example) for example in clerk_body["examples"]]
        assert [example["object"] for _, example in examples[:2]] == ["event", "v2.core.event"]
        for provider, example in examples:
            for body, status in (
                (example, 200),
                ({}, 400),
                ({key: value for key, value in example.items() if key != "type"}, 400),
                ({**example, "type": ""}, 400),
            ):
                raw, signature = signed(provider, body, webhook_secrets[provider])
                answer = await client.post(f"/webhooks/{provider}", content=raw, headers=signature)
                assert answer.status_code == status, (provider, body, answer.text)
        thin_example = stripe_body["examples"][1]
        for related in ({}, {"id": "in_1"}, {"type": "invoice"}, {"id": 7, "type": "invoice"}, "in_1"):
            raw, signature = signed("stripe", {**thin_example, "related_object": related}, webhook_secrets["stripe"])
            answer = await client.post("/webhooks/stripe", content=raw, headers=signature)
            assert answer.status_code == 400, (related, answer.text)
