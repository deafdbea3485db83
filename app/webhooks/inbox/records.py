"""What the inbox's statements give back, typed: a stored event, an operator's record, an event set aside."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import asyncpg

from app.core.tracing import trace_id_of

Outcome = Literal["inserted", "reopened", "existing"]
State = Literal["pending", "failed", "set_aside", "processed"]
STATES: tuple[State, ...] = ("pending", "failed", "set_aside", "processed")


@dataclass(frozen=True, slots=True)
class StoredEvent:
    row_id: int
    outcome: Outcome
    processed: bool
    request_id: str | None = None  # the stored row's: its first delivery's, which its processing logs
    tenant_key: str | None = None  # the stored row's


@dataclass(frozen=True, slots=True)
class SetAside:
    """An event just set aside (its alert names it): by an attempt, a sync or the recovery cron."""

    provider: str
    event_id: str
    type: str
    attempts: int
    last_error: str | None

    @classmethod
    def of(cls, row: asyncpg.Record) -> SetAside:
        return cls(row["provider"], row["event_id"], row["type"], row["attempts"], row["last_error"])


@dataclass(frozen=True)
class EventRecord:
    """An inbox row as operators see it; ``payload`` (the JSON text) only where asked for."""

    id: int
    provider: str
    event_id: str
    type: str
    received_at: datetime
    processed_at: datetime | None
    attempts: int
    last_error: str | None
    abandoned_at: datetime | None
    request_id: str | None = None
    replayed_at: datetime | None = None
    tenant_key: str | None = None
    sync_subject: str | None = None
    related_object: str | None = None
    """A thin event's (Stripe's ``v2.core.event``): the object it is about, ``type id`` (``subscription sub_1``)."""
    trace_context: str | None = None
    payload: str | None = None

    @classmethod
    def of(cls, row: asyncpg.Record) -> EventRecord:
        return cls(**dict(row))

    @property
    def trace_id(self) -> str | None:
        """The trace of the delivery that stored it (tracing on), to search a tracing backend with."""
        return trace_id_of(self.trace_context)

    @property
    def state(self) -> State:
        if self.processed_at is not None:
            return "processed"
        if self.abandoned_at is not None:
            return "set_aside"
        return "failed" if self.attempts else "pending"
