"""What a provider's module offers the backfill: its API's list of recent events (``app.webhooks.backfill``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from app.core.resources import Resources


@dataclass(frozen=True)
class ListedEvent:
    """An event as the provider's API lists it: the payload is what its webhook would have carried."""

    event_id: str
    event_type: str
    created: datetime
    payload: dict[str, Any]


class EventSource(Protocol):
    """A provider's list of its recent events, newest first, a page at a time."""

    label: str
    """How messages name the provider's events ("Stripe")."""

    def pages(self, resources: Resources, since: datetime, until: datetime) -> AsyncIterator[list[ListedEvent]]: ...
