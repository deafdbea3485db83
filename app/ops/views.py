"""What the operations page shows, as the templates read it: rows, filters and the ways times are written (no I/O)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast
from urllib.parse import urlencode

from markupsafe import Markup, escape

from app.ops.pipeline_state import PipelineState
from app.webhooks.inbox import STATES, State

PAGE_SIZE = 50


@dataclass(frozen=True)
class ProviderRow:
    provider: str
    pending: int
    failed: int
    set_aside: int
    processed_24h: int
    refused_1h: int
    latency: tuple[int, float, float] | None  # events, p50 and p99 seconds, over the last hour


@dataclass(frozen=True)
class TenantRow:
    """A tenant with unprocessed events (a Stripe customer, a Clerk organization or user)."""

    provider: str
    tenant_key: str
    unprocessed: int
    oldest: datetime


@dataclass(frozen=True)
class Overview:
    providers: list[ProviderRow]
    state: PipelineState
    tenants: list[TenantRow]
    """The tenants with the most unprocessed events, most first."""
    refused: dict[str, list[RefusalRow]]
    """Per provider: its refusals of the last hour by reason (the reasons with any), the ones behind its count."""


@dataclass(frozen=True)
class RefusalRow:
    reason: str
    """A ``Refusal`` value: ``rejected_signature``..."""
    count: int

    @property
    def meaning(self) -> str:
        return REFUSAL_MEANINGS.get(self.reason, "")


REFUSAL_MEANINGS = {
    "rejected_signature": "Missing, wrong or stale signature: after a secret rotation, check the webhook secret.",
    "rejected_payload": "Signed, but not a JSON object with an id and a type within the limits.",
    "too_large": "Over WEBHOOK_MAX_BODY_BYTES.",
    "rate_limited": "Over WEBHOOK_RATE_LIMIT_PER_MINUTE from one client (check TRUSTED_PROXIES behind a proxy).",
}
"""What each reason of a refusal means, for the overview (docs/operations.md says more)."""


@dataclass(frozen=True)
class EventFilters:
    provider: str | None = None
    state: State | None = None
    type: str | None = None
    event_id: str | None = None
    tenant: str | None = None

    @classmethod
    def of(cls, query: dict[str, str]) -> EventFilters:
        state = query.get("state") or None
        return cls(
            provider=query.get("provider") or None,
            state=cast(State, state) if state in STATES else None,
            type=query.get("type") or None,
            event_id=query.get("event_id") or None,
            tenant=query.get("tenant") or None,
        )

    def query(self, **extra: Any) -> str:
        """The filters (and ``extra``) as a query string for the next page's link."""
        items = {
            "provider": self.provider,
            "state": self.state,
            "type": self.type,
            "event_id": self.event_id,
            "tenant": self.tenant,
            **extra,
        }
        return urlencode({key: value for key, value in items.items() if value})


_BREAK_AFTER = re.compile(r"([._\-:/])(?=.)")
_BREAK_BEFORE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def breakable(text: object) -> Markup:
    """A name as a narrow screen may break it: ``macros.html.j2``'s ``name``, in Python (a timeline shows hundreds).

    Before a capital that follows a lower-case letter or a digit, after a dot, underscore, hyphen, colon or slash.
    """
    escaped = str(escape(str(text)))
    # Escaping adds no capitals and only "&...;" sequences, whose ";" and "#" are no break points.
    return Markup(_BREAK_AFTER.sub(r"\1<wbr>", _BREAK_BEFORE.sub("<wbr>", escaped)))


def pretty_json(text: str | None) -> str:
    if text is None:
        return ""
    return json.dumps(json.loads(text), indent=2, sort_keys=True)


def duration(seconds: float) -> str:
    """A latency as an operator reads it: ``0.42 s``, ``38 s``, ``25 min``, ``3.5 h``."""
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def ago(at: datetime | None, now: datetime) -> str:
    if at is None:
        return "never"
    seconds = int((now - at).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"
