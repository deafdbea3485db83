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
- a NUL character (``\\u0000``), which ``jsonb`` cannot hold: replaced by U+FFFD.

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


def check_event_field(name: str, value: Any) -> str:
    """An event id or type: a non-empty string of at most 255 characters without NUL."""
    if not isinstance(value, str) or not value:
        raise PayloadError(f"The event needs a non-empty string {name!r}.")
    if len(value) > MAX_FIELD_CHARS:
        raise PayloadError(f"The event's {name!r} is longer than {MAX_FIELD_CHARS} characters.")
    if "\x00" in value:
        raise PayloadError(f"The event's {name!r} holds a NUL character.")
    return value


def encode_for_inbox(payload: dict[str, Any], raw: bytes = b"") -> tuple[str, bool]:
    """The text the inbox stores (the body ``raw`` as received, if given), and whether NUL characters had to be
    replaced in it (then it is re-encoded)."""
    if b"\\u0000" in raw:  # one scan of the body; the payload is walked only when it may hold a NUL
        cleaned = _without_nul(payload)
        if cleaned != payload:
            return _encoder.encode(cleaned).decode(), True
        return normalized_for_inbox(payload), False
    return (raw.decode() if raw else normalized_for_inbox(payload)), False


def normalized_for_inbox(payload: dict[str, Any]) -> str:
    """The payload as the decoder read it: for a body Postgres refused as received (a number beyond ``numeric``)."""
    return _encoder.encode(payload).decode()


def _without_nul(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_without_nul(key): _without_nul(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_without_nul(item) for item in value]
    return value
