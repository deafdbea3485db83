"""The one JSON reading of an event body: intake parses it with these rules, and so does the worker.

Whatever the intake stores, the worker can read, because both sides decode with
:func:`decode_payload`, and the inbox stores only a body that passed it:
:func:`encode_for_inbox` gives the body as received (Postgres parses exactly
what the decoder accepted; re-encoding it cost a few percent of the intake's
CPU), or re-encoded where Postgres could not hold it. That closes three ways a
signed body could be stored and then never processed:

- a number JSON allows but a decoder refuses (a 5,000-digit integer, ``1e400``):
  refused here, at intake, with a 400;
- a number Postgres cannot store (``1e-20000`` overflows ``numeric``): the
  insert of the body as received fails, and it is stored as the decoder read
  it (:func:`normalized_for_inbox`, the double it decodes to), so the insert
  cannot fail on every delivery;
- a NUL character (``\\u0000``), which neither ``jsonb`` nor ``text`` can hold:
  replaced by U+FFFD (:func:`storable`) in the payload that the intake stores
  *and* derives every other value from (the event's tenant and subject), so
  none of those can carry one either. An event's id and type are refused with
  a 400 instead: they name the event, and a changed id would be another event.

Nesting is limited to :data:`MAX_DEPTH` levels; deeper bodies are refused (a
10,000-deep array once took the decoder to its recursion limit).
"""

from __future__ import annotations

from typing import Any

import msgspec

MAX_DEPTH = 64
MAX_FIELD_CHARS = 255
"""Event ids and types longer than this cannot be stored (``varchar(255)``): refused, not retried."""

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


class PayloadError(Exception):
    """A body that is not a JSON object these rules accept: answered 400, nothing stored."""


def decode_payload(raw: bytes | str) -> dict[str, Any]:
    """The body as a dict, or :class:`PayloadError` naming what is wrong with it."""
    data = raw.encode() if isinstance(raw, str) else raw
    try:
        payload = _decoder.decode(data)
    except msgspec.ValidationError:  # valid JSON holding a number out of range (its message would name the key)
        raise PayloadError("The JSON holds a number out of range.") from None
    except msgspec.DecodeError:
        raise PayloadError("Not valid JSON (UTF-8).") from None
    except RecursionError:
        raise PayloadError(f"The JSON is nested more than {MAX_DEPTH} levels deep.") from None
    if not isinstance(payload, dict):
        raise PayloadError("The JSON is not an object.")
    # A body with at most MAX_DEPTH opening brackets (strings included) cannot nest deeper: most events
    # stop at this count (a few microseconds); the others are walked (about 15 us for a 4 KB invoice).
    if data.count(b"[") + data.count(b"{") > MAX_DEPTH and _nested_deeper_than(payload, MAX_DEPTH):
        raise PayloadError(f"The JSON is nested more than {MAX_DEPTH} levels deep.")
    return payload


def _nested_deeper_than(value: dict[str, Any], limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in node.values() if type(node) is dict else node:
            if type(child) is dict or type(child) is list:
                stack.append((child, depth + 1))
    return False


def check_event_field(name: str, value: Any, holder: str = "The event") -> str:
    """An event id or type, or another value that becomes a key (``holder`` names what carries it, for the
    message): a non-empty string of at most 255 characters without NUL."""
    if not isinstance(value, str) or not value:
        raise PayloadError(f"{holder} needs a non-empty string {name!r}.")
    if len(value) > MAX_FIELD_CHARS:
        raise PayloadError(f"{holder}'s {name!r} is longer than {MAX_FIELD_CHARS} characters.")
    if "\x00" in value:
        raise PayloadError(f"{holder}'s {name!r} holds a NUL character.")
    return value


def storable(payload: dict[str, Any], raw: bytes | None = None) -> tuple[dict[str, Any], bool]:
    """The payload with every NUL character (in values and keys, at any depth) replaced by U+FFFD, and whether
    there was one: Postgres can hold a NUL neither in ``jsonb`` nor in ``text``.

    It is the payload everything at intake is read from, so no value derived from it (a tenant key, a sync
    subject, an object id) can carry a NUL the stored payload does not. ``raw``: the body it was decoded from;
    the payload is walked only when the body holds the escape ``\\u0000`` (most bodies are passed through).
    """
    if raw is not None and b"\\u0000" not in raw:
        return payload, False
    return _without_nul(payload)


def encode_for_inbox(payload: dict[str, Any], raw: bytes = b"", *, nul_replaced: bool = False) -> str:
    """The text the inbox stores: the body ``raw`` as received, or the payload re-encoded when there is no body or
    NUL characters were replaced in it (``nul_replaced``, from :func:`storable`)."""
    return normalized_for_inbox(payload) if nul_replaced or not raw else raw.decode()


def normalized_for_inbox(payload: dict[str, Any]) -> str:
    """The payload as the decoder read it: for a body Postgres refused as received (a number beyond ``numeric``)."""
    return _encoder.encode(payload).decode()


def _without_nul(value: Any) -> tuple[Any, bool]:
    if isinstance(value, str):
        return (value.replace("\x00", "\ufffd"), True) if "\x00" in value else (value, False)
    if isinstance(value, dict):
        replaced, items = False, {}
        for key, item in value.items():
            new_key, key_replaced = _without_nul(key)
            items[new_key], item_replaced = _without_nul(item)
            replaced = replaced or key_replaced or item_replaced
        return (items, True) if replaced else (value, False)
    if isinstance(value, list):
        pairs = [_without_nul(item) for item in value]
        return ([item for item, _ in pairs], True) if any(changed for _, changed in pairs) else (value, False)
    return value, False
