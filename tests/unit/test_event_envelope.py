"""A provider says where its events carry their id and type; the envelope reads and checks them alike for all."""

from __future__ import annotations

import json

import pytest

from app.webhooks.providers.base import EventEnvelope, PayloadError, VerifiedEvent
from app.webhooks.providers.clerk import ENVELOPE as CLERK_ENVELOPE
from app.webhooks.providers.stripe import ENVELOPE as STRIPE_ENVELOPE
from app.webhooks.providers.stripe import check_thin_event


def body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def test_each_provider_reads_the_id_where_its_deliveries_carry_it() -> None:
    stripe = STRIPE_ENVELOPE.read(body(id="evt_1", type="invoice.paid"), {})
    clerk = CLERK_ENVELOPE.read(body(id="not-this", type="user.created"), {"svix-id": "msg_1"})
    acme = EventEnvelope(id_field="event_id", type_field="kind").read(body(event_id="ord-1", kind="order.paid"), {})

    assert (stripe.event_id, stripe.event_type) == ("evt_1", "invoice.paid")
    assert (clerk.event_id, clerk.event_type) == ("msg_1", "user.created")
    assert (acme.event_id, acme.event_type, acme.payload) == (
        "ord-1",
        "order.paid",
        {"event_id": "ord-1", "kind": "order.paid"},
    )


@pytest.mark.parametrize(
    ("sent", "headers", "refused"),
    [
        (b"[1, 2]", {}, "The JSON is not an object."),
        (body(type="invoice.paid"), {}, "The event needs a non-empty string 'id'."),
        (body(id="evt_1", type=""), {}, "The event needs a non-empty string 'type'."),
        (body(id="evt_1", type=7), {}, "The event needs a non-empty string 'type'."),
        (body(id="e" * 256, type="invoice.paid"), {}, "The event's 'id' is longer than 255 characters."),
        (body(id="evt\u0000", type="invoice.paid"), {}, "The event's 'id' holds a NUL character."),
    ],
)
def test_a_body_without_a_usable_id_and_type_is_refused_naming_what_is_wrong(
    sent: bytes, headers: dict[str, str], refused: str
) -> None:
    with pytest.raises(PayloadError) as caught:
        STRIPE_ENVELOPE.read(sent, headers)
    assert str(caught.value) == refused


def test_a_header_id_is_checked_as_a_body_id_is() -> None:
    with pytest.raises(PayloadError) as caught:
        CLERK_ENVELOPE.read(body(type="user.created"), {})
    assert str(caught.value) == "The event needs a non-empty string 'id'."


def test_a_thin_events_related_object_is_checked_as_an_event_id_is_and_named_in_the_message() -> None:
    def thin(related: object) -> VerifiedEvent:
        return VerifiedEvent("evt_1", "v1.invoice.paid", {"object": "v2.core.event", "related_object": related})

    check_thin_event(thin({"id": "in_1", "type": "invoice"}))
    with pytest.raises(PayloadError) as missing:
        check_thin_event(thin({"id": "in_1"}))
    with pytest.raises(PayloadError) as too_long:
        check_thin_event(thin({"id": "i" * 256, "type": "invoice"}))
    assert str(missing.value) == "The thin event's related_object needs a non-empty string 'type'."
    assert str(too_long.value) == "The thin event's related_object's 'id' is longer than 255 characters."
