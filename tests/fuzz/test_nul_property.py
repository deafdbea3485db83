"""A property of intake: characters Postgres cannot store, anywhere in a signed event, never make it a 5xx.

Postgres' ``text`` and ``jsonb`` refuse one character, NUL (``\\u0000``); JSON
can also carry lone surrogates (``\\ud800``), which no UTF-8 text holds. Signed
events of every type billing and identity handle (Stripe's thin events too)
are built from the test kit's real-shaped fixtures, and such characters are
put into strings and keys anywhere in them, the ids their tenant and subject
are read from included. Each is delivered twice to a real API process.
Whatever the body, the answers hold (docs/behaviour.md):

- a lone surrogate anywhere, or a NUL in the event's id or type (or in a thin
  event's keys naming its related object's id and type): 400 both times,
  nothing stored;
- any other NUL: 200 both times, stored once, with U+FFFD in its place in the
  payload and in every key read from it (the tenant, the sync subject);
- never a 5xx, and the API logs no error and no traceback;
- every stored event is then handled by the worker's own code: processed, or
  set aside for a reason that names the event (a Stripe object Stripe does
  not know, a field it lacks), never failing on what Postgres cannot hold.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stripe import WebhookSignature
from svix.webhooks import Webhook

from app.billing.events_api import STRIPE_EVENT_TYPES, STRIPE_THIN_EVENT_TYPES
from app.core.settings import load_settings
from app.queue.errors import RetryLater
from app.runtime import WORKER_MODULES, open_resources
from app.testing.deliveries import clerk_event, random_id, stripe_event, stripe_object
from app.testing.fixtures import stripe_stub, stripe_stub_server
from app.testing.stripe_stub import StripeStub
from app.testing.thin_deliveries import stripe_thin_event
from app.webhooks.processing import process_event
from tests.processes import logged_api_process
from tests.webhooks.conftest import inbox_rows

__all__ = ["stripe_stub", "stripe_stub_server"]
pytestmark = pytest.mark.slow(12)

EXAMPLES = 200
CLERK_TYPES = [
    f"{kind}.{action}"
    for kind in ("user", "organization", "organizationMembership")
    for action in ("created", "updated", "deleted")
]
# The object each handled Stripe type carries (a fixture of the test kit).
STRIPE_OBJECTS = {
    "checkout.session.": "checkout.session",
    "customer.subscription.": "subscription",
    "invoice.": "invoice",
    "charge.dispute.": "dispute",
    "charge.refunded": "charge",
    "refund.": "refund",
    "radar.early_fraud_warning.": "radar.early_fraud_warning",
}
NUL, SURROGATES = "\x00", ("\ud800", "\udfff")
THIN_OBJECT_KEYS = (("related_object",), ("related_object", "id"), ("related_object", "type"))
UNSTORABLE_ERRORS = ("CharacterNotInRepertoire", "UntranslatableCharacter", "invalid byte sequence", "surrogate")


def _stripe_object(event_type: str) -> dict[str, Any]:
    kind = next(kind for prefix, kind in STRIPE_OBJECTS.items() if event_type.startswith(prefix))
    return stripe_object(kind)


@dataclass
class Poisoned:
    provider: str
    event: dict[str, Any]
    outcome: int
    """What the oracle expects, written apart from the code under test: 400, or 200 and stored."""


def _sites(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], str]]:
    """Every place a character can go: each string value ("value") and each object key ("key")."""
    if isinstance(value, str):
        yield path, "value"
    elif isinstance(value, dict):
        for key, item in value.items():
            yield (*path, key), "key"
            yield from _sites(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _sites(item, (*path, index))


def _poison(event: dict[str, Any], path: tuple[Any, ...], where: str, char: str, at: float) -> None:
    parent: Any = event
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if where == "key":
        parent[_inserted(last, char, at)] = parent.pop(last)
    else:
        parent[last] = _inserted(parent[last], char, at)


def _inserted(text: str, char: str, at: float) -> str:
    cut = round(len(text) * at)
    return text[:cut] + char + text[cut:]


@st.composite
def poisoned_event(draw: st.DrawFn) -> Poisoned:
    provider = draw(st.sampled_from(["stripe", "stripe", "clerk"]))
    thin = provider == "stripe" and draw(st.booleans())
    if thin:
        event = stripe_thin_event(draw(st.sampled_from(STRIPE_THIN_EVENT_TYPES)), random_id("obj"))
    elif provider == "stripe":
        event_type = draw(st.sampled_from(STRIPE_EVENT_TYPES))
        event = stripe_event(event_type, _stripe_object(event_type))
    else:
        event = clerk_event(draw(st.sampled_from(CLERK_TYPES)))
    sites = list(_sites(event))
    # Where an event's tenant and subject are read from, as often as anywhere else together.
    keyed = [site for site in sites if site[0][-1:] in (("customer",), ("id",)) and site[1] == "value"]
    chosen = draw(st.lists(st.sampled_from(keyed) | st.sampled_from(sites), min_size=1, max_size=3, unique=True))
    outcome = 200
    # Deepest first, and a value before its own key: a site changed earlier never hides one changed later.
    for path, where in sorted(chosen, key=lambda site: (-len(site[0]), site[1] == "key")):
        char = draw(st.sampled_from([NUL, NUL, NUL, *SURROGATES]))
        _poison(event, path, where, char, draw(st.sampled_from([0.0, 0.5, 1.0])))
        names_the_event = len(path) == 1 and path[0] in (("id", "type") if provider == "stripe" else ("type",))
        # A thin event without its related object's id and type names nothing to read: refused.
        names_its_object = thin and where == "key" and path in THIN_OBJECT_KEYS
        if char in SURROGATES or names_the_event or names_its_object:
            outcome = 400  # undecodable, or the event's id or type (refused, or gone when its key changed)
    return Poisoned(provider, event, outcome)


def _delivery(poisoned: Poisoned, secrets: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    """Signed as the provider signs: the body with NUL and lone surrogates as ``\\u`` escapes (``json.dumps``)."""
    body = json.dumps(poisoned.event).encode()
    if poisoned.provider == "stripe":
        header = WebhookSignature.generate_signature_header(
            body.decode(), secrets["stripe"], timestamp=int(time.time())
        )
        return body, {"Content-Type": "application/json", "Stripe-Signature": header}
    msg_id, when = f"msg_nul_{time.monotonic_ns()}", datetime.now(UTC)
    return body, {
        "Content-Type": "application/json",
        "svix-id": msg_id,
        "svix-timestamp": str(int(when.timestamp())),
        "svix-signature": Webhook(secrets["clerk"]).sign(msg_id, when, body.decode()),
    }


@dataclass
class Sent:
    stored: int = 0
    refused: int = 0
    answers: dict[int, int] = field(default_factory=dict)


@pytest.fixture
def api(settings_env: dict[str, str], stripe_stub: StripeStub, tmp_path: Path) -> Iterator[tuple[httpx.Client, Path]]:
    env = {**settings_env, "LOG_FORMAT": "json", "WEBHOOK_RATE_LIMIT_PER_MINUTE": "1000000"}
    log = tmp_path / "api.log"
    with logged_api_process(env, log) as base_url, httpx.Client(base_url=base_url, timeout=15) as client:
        yield client, log


def test_unstorable_characters_anywhere_in_a_signed_event_get_400_or_are_stored_once_and_handled(
    api: tuple[httpx.Client, Path],
    settings_env: dict[str, str],
    stripe_stub: StripeStub,
    webhook_secrets: dict[str, str],
) -> None:
    client, log = api
    sent = Sent()

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(poisoned=poisoned_event())
    def one(poisoned: Poisoned) -> None:
        body, headers = _delivery(poisoned, webhook_secrets)
        for _ in range(2):  # a provider's retry of the same delivery
            status = client.post(f"/webhooks/{poisoned.provider}", content=body, headers=headers)
            sent.answers[status.status_code] = sent.answers.get(status.status_code, 0) + 1
            assert status.status_code == poisoned.outcome, (poisoned.provider, status.text)
        sent.stored += poisoned.outcome == 200
        sent.refused += poisoned.outcome == 400

    one()
    assert sent.stored and sent.refused, sent  # both kinds were tried
    logged = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    errors = [line for line in logged if line.get("level") in ("error", "critical") or "exception" in line]
    assert not errors, errors[:3]
    assert "Traceback" not in log.read_text()
    asyncio.run(_handled_by_the_worker(settings_env, stripe_stub, sent.stored))


async def _handled_by_the_worker(settings_env: dict[str, str], stripe_stub: StripeStub, stored: int) -> None:
    """Each stored event once through the worker's code: processed, or set aside for a reason of its own."""
    env = {
        **settings_env,
        "STRIPE_API_BASE": stripe_stub.base_url,
        "MESSAGE_QUEUE_DRIVER": "sync",
        "STRIPE_API_RATE_LIMIT_PER_SECOND": "1000",
    }
    resources = open_resources(load_settings(env), WORKER_MODULES)
    try:
        rows = await inbox_rows(resources)
        assert len(rows) == stored  # each once, though delivered twice
        for row in rows:
            assert NUL not in json.dumps(row.payload, ensure_ascii=False)
            assert NUL not in f"{row.tenant_key}{row.sync_subject}"
            for _ in range(20):  # a Stripe sync may be told to come back for its reservation of the budget
                try:
                    await process_event(resources, row.id, row.provider)
                    break
                except RetryLater:
                    await asyncio.sleep(0.05)
                except Exception:  # recorded on the row: read below
                    break
        for row in await inbox_rows(resources):
            done = row.processed_at is not None or row.abandoned_at is not None
            assert done, (row.provider, row.type, row.last_error)
            assert not any(word in (row.last_error or "") for word in UNSTORABLE_ERRORS), row.last_error
    finally:
        await resources.close()
