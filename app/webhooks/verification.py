"""What a verified delivery is, and the checks every provider's verifier shares.

A verifier checks the signature over the exact bytes received and returns a
:class:`VerifiedEvent`, built from the body parsed by :func:`decode_payload`
(the one JSON reading intake and worker share); the event's id and type are
checked on the way in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import InitVar, dataclass, field
from typing import Any

from app.webhooks.payload import PayloadError, check_event_field, decode_payload, storable

__all__ = [
    "MAX_SIGNATURE_HEADER_BYTES",
    "Headers",
    "PayloadError",
    "SignatureError",
    "VerifiedEvent",
    "Verifier",
    "checking_handled",
    "decode_payload",
    "signature_header",
]

Headers = Mapping[str, str]
MAX_SIGNATURE_HEADER_BYTES = 8192
"""A signature header longer than this is refused before any HMAC is computed (a 6.5 MB one took 180 ms)."""


class SignatureError(Exception):
    """Missing, wrong, garbled or stale signature: answered 400, nothing stored."""


@dataclass(frozen=True)
class VerifiedEvent:
    """A delivery whose signature verified; its id and type are valid inbox keys (checked here).

    ``payload`` is the body as the inbox stores it, NUL characters replaced by U+FFFD (``storable``): whatever is
    derived from it (the event's tenant and sync subject, a thin event's object id) is storable too. ``raw``,
    the body it was decoded from, only spares a walk of a payload that holds no NUL.
    """

    event_id: str
    event_type: str
    payload: dict[str, Any] = field(repr=False)
    raw: InitVar[bytes | None] = None
    nul_replaced: bool = field(init=False, default=False)
    """Whether NUL characters were replaced: the body is then stored re-encoded, not as received."""

    def __post_init__(self, raw: bytes | None) -> None:
        check_event_field("id", self.event_id)
        check_event_field("type", self.event_type)
        payload, replaced = storable(self.payload, raw)
        object.__setattr__(self, "payload", payload)
        object.__setattr__(self, "nul_replaced", replaced)

    @classmethod
    def of(cls, event_id: Any, event_type: Any, payload: dict[str, Any], raw: bytes | None = None) -> VerifiedEvent:
        """From values read out of a body or headers, whatever their type (checked, :class:`PayloadError`)."""
        return cls(check_event_field("id", event_id), check_event_field("type", event_type), payload, raw)


Verifier = Callable[[bytes, Headers], VerifiedEvent]


def checking_handled(
    verify: Verifier, handles: Callable[[str], bool], check: Callable[[VerifiedEvent], None] | None
) -> Verifier:
    """``verify``, then ``check`` on a body whose type a loaded module handles: what no handler could use is refused
    with the signature's checks (400), while a type nobody handles is still answered 200 and dropped."""
    if check is None:
        return verify

    def verify_and_check(body: bytes, headers: Headers) -> VerifiedEvent:
        event = verify(body, headers)
        if handles(event.event_type):
            check(event)
        return event

    return verify_and_check


def signature_header(headers: Headers, name: str) -> str:
    """A signature header's value: present, ASCII and at most 8 KB, or :class:`SignatureError`."""
    value = headers.get(name)
    if not value:
        raise SignatureError(f"Missing {name} header.")
    if len(value) > MAX_SIGNATURE_HEADER_BYTES:
        raise SignatureError(f"{name} header is longer than {MAX_SIGNATURE_HEADER_BYTES} bytes.")
    if not value.isascii():
        raise SignatureError(f"{name} header holds non-ASCII characters.")
    return value
