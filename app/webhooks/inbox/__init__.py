"""The webhook inbox: one repository for every statement on ``webhook_event``."""

from app.webhooks.inbox.repository import (
    STATES,
    EventRecord,
    Inbox,
    PeekedEvent,
    State,
    StoredEvent,
    event_lock_key,
)

__all__ = ["STATES", "EventRecord", "Inbox", "PeekedEvent", "State", "StoredEvent", "event_lock_key"]
