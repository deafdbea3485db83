"""A third provider is one small unit plus one registration: shown with a generic HMAC-signed source."""

from __future__ import annotations

import hashlib
import hmac
import json
import types
from typing import Any

import pytest

from app.core.module import FeatureModule
from app.core.settings import Settings
from app.runtime import open_resources
from app.webhooks.handlers import EventRoutes, WebhookContext
from app.webhooks.jobs import ProcessWebhookEventJob, processing_job
from app.webhooks.module import build_webhooks_module
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
from app.webhooks.providers.clerk import ProcessClerkEventJob
from app.webhooks.providers.stripe import ProcessStripeEventJob
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


def test_each_shipped_provider_has_its_declared_job_on_its_own_queue_by_its_name() -> None:
    """The names arq, the metrics, the logs, the alerts and /ops know the jobs by."""
    assert (ProcessStripeEventJob.name(), ProcessStripeEventJob.provider) == ("ProcessStripeEventJob", "stripe")
    assert (ProcessClerkEventJob.name(), ProcessClerkEventJob.provider) == ("ProcessClerkEventJob", "clerk")
    assert processing_job("stripe") is ProcessStripeEventJob and ProcessStripeEventJob.queue == "webhook-stripe-queue"
    assert processing_job("clerk") is ProcessClerkEventJob and ProcessClerkEventJob.queue == "webhook-clerk-queue"
    assert processing_job("acme") is ProcessWebhookEventJob  # no queue of its own: the shared job
    assert [job.name() for job in build_webhooks_module((*PROVIDERS, ACME)).jobs] == [
        "ProcessWebhookEventJob",
        "ProcessStripeEventJob",
        "ProcessClerkEventJob",
        "WebhookBackfillJob",
    ]


def test_a_provider_with_a_queue_of_its_own_declares_its_job_in_one_line() -> None:
    own = WebhookProvider(name="acme-own", build_verifier=_acme_verifier, queue="webhook-acme-queue")
    with pytest.raises(TypeError, match=r"'acme-own' names webhook-acme-queue .* declare its own beside it"):
        build_webhooks_module((own,))

    class ProcessAcmeOwnEventJob(ProcessWebhookEventJob, provider=own):
        """Acme's events, on their own queue."""

    module = build_webhooks_module((own,))
    assert ProcessAcmeOwnEventJob in module.jobs and module.queues == ["webhook-acme-queue"]
    assert (processing_job("acme-own"), ProcessAcmeOwnEventJob.queue) == (ProcessAcmeOwnEventJob, "webhook-acme-queue")
    with pytest.raises(TypeError, match=r"'acme-own' has a job already \(ProcessAcmeOwnEventJob\)"):
        types.new_class("AnotherAcmeEventJob", (ProcessWebhookEventJob,), {"provider": own})  # a second class
