"""JSON on the wire (msgspec), never pickle: a pickle read from Redis is code execution.

arq serialises the job envelope (function name, args, kwargs, try, enqueue time)
and, for failures it records itself, the result; both go through these two
functions on both sides (the API's pool and the worker).
"""

from __future__ import annotations

from typing import Any

import msgspec


def _fallback(value: Any) -> Any:
    # arq stores an exception as the result of a job it failed itself (expired,
    # unknown function): keep its text instead of failing the serialisation.
    return repr(value)


_encoder = msgspec.json.Encoder(enc_hook=_fallback)
_decoder = msgspec.json.Decoder(dict[str, Any])


def serialize(envelope: dict[str, Any]) -> bytes:
    return _encoder.encode(envelope)


def deserialize(raw: bytes) -> dict[str, Any]:
    return _decoder.decode(raw)


def as_read_back(value: Any) -> Any:
    """``value`` as it comes out of the queue: through JSON and back (what the sync driver gives a job)."""
    return msgspec.json.decode(_encoder.encode(value))
