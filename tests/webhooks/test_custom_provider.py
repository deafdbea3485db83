"""A third provider is one small unit plus one registration: shown with a generic HMAC-signed source."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from app.core.module import FeatureModule
from app.core.settings import Settings
from app.runtime import open_resources
from app.webhooks.handlers import EventRoutes, WebhookContext
from app.webhooks.processing import process_event
from app.webhooks.providers import PROVIDERS
from app.webhooks.providers.base import (
    EventEnvelope,
    Headers,
    SignatureError,
    VerifiedEvent,
    Verifier,
    WebhookProvider,
)
from tests.webhooks.conftest import inbox_rows

ACME_SECRET = b"acme-shared-secret"
ACME_ENVELOPE = EventEnvelope(id_field="event_id", type_field="kind")


def _acme_verifier(settings: Settings) -> Verifier | None:
    def verify(body: bytes, headers: Headers) -> VerifiedEvent:
        expected = "sha256=" + hmac.new(ACME_SECRET, body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(headers.get("x-acme-signature", ""), expected):
            raise SignatureError("Bad X-Acme-Signature.")
        return ACME_ENVELOPE.read(body, headers)

    return verify


ACME = WebhookProvider(name="acme", build_verifier=_acme_verifier)


def acme_delivery(event_id: str, kind: str) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"event_id": event_id, "kind": kind}).encode()
    signature = "sha256=" + hmac.new(ACME_SECRET, body, hashlib.sha256).hexdigest()
    return body, {"X-Acme-Signature": signature, "Content-Type": "application/json"}


async def test_a_registered_throwaway_provider_is_verified_stored_and_handled(
    make_client: Any, settings: Settings
) -> None:
    handled: list[str] = []

    async def handle_acme(context: WebhookContext) -> None:
        handled.append(context.payload["event_id"])

    acme_module = FeatureModule(name="acme", webhook_handlers={"acme": EventRoutes({"order.*": handle_acme})})
    client = await make_client(providers=(*PROVIDERS, ACME), extra_modules=(acme_module,))

    body, headers = acme_delivery("ord-1", "order.paid")
    assert (await client.post("/webhooks/acme", content=body, headers=headers)).status_code == 200
    forged = {**headers, "X-Acme-Signature": "sha256=00"}
    assert (await client.post("/webhooks/acme", content=body, headers=forged)).status_code == 400
    ignored_body, ignored_headers = acme_delivery("ord-2", "customer.created")
    assert (await client.post("/webhooks/acme", content=ignored_body, headers=ignored_headers)).status_code == 200

    resources = open_resources(settings, [acme_module])
    try:
        (row,) = await inbox_rows(resources)
        assert (row.provider, row.event_id, row.type) == ("acme", "ord-1", "order.paid")
        await process_event(resources, row.id)
    finally:
        await resources.close()
    assert handled == ["ord-1"]
