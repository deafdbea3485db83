"""The webhook inbox: the one door to ``webhook_event``, its statements split by who runs them (``repository.py``)."""

from app.webhooks.inbox.attempt import AttemptStatements, Claim, Unclaimed, event_lock_key
from app.webhooks.inbox.coverage import InboxCoverage, MarkedEvent, PeekedEvent
from app.webhooks.inbox.reads import InboxReads
from app.webhooks.inbox.records import STATES, EventRecord, SetAside, State, StoredEvent
from app.webhooks.inbox.repository import Inbox
from app.webhooks.inbox.upkeep import InboxUpkeep

__all__ = [
    "STATES",
    "AttemptStatements",
    "Claim",
    "EventRecord",
    "Inbox",
    "InboxCoverage",
    "InboxReads",
    "InboxUpkeep",
    "MarkedEvent",
    "PeekedEvent",
    "SetAside",
    "State",
    "StoredEvent",
    "Unclaimed",
    "event_lock_key",
]
