"""A workspace's timeline: the inbox events of its tenants and the journal rows of its rows, newest first.

What ``/ops/workspaces/<id>`` and ``litestar workspaces timeline ID`` show:

- each inbox event of the workspace's Stripe customer or Clerk organization
  (its tenant keys), with the journal rows it caused (``source`` names it);
- each journal row not caused by an event of the page (a job, a cron, a
  command; or an event of no tenant of the workspace, e.g. a dispute keyed by
  its charge), grouped by cause and time: one transaction;
- what waits for the workspace: its events still to process, the Stripe read
  of its customer, the member-limit job of that read.

A page merges the two streams by time (an event by its arrival, a journal row
by its transaction's time; at one time, the change first) and stops after
``limit`` items; the cursor says where the next page starts. Every read is
bounded by the page, whatever the size of the inbox or the journal.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from app.billing.handlers import customer_tenant
from app.billing.repository import BillingRepository
from app.billing.sync import sync_cause
from app.core.journal import event_cause, event_of
from app.core.resources import Resources
from app.identity.handlers import organization_tenant
from app.identity.repository import JournalRepository, JournalRow, WorkspaceRepository, WorkspaceSummary
from app.identity.seats import ApplyWorkspaceMemberLimitJob, member_limit_job_id
from app.queue.errors import QueueUnavailableError
from app.webhooks.inbox import EventRecord, Inbox

PAGE_SIZE = 50
JOURNAL_READ = 4
"""Journal rows read per entry of a page: most are shown beside their event and take no place of their own."""
WAITING_EVENTS = 20
_MAX_ID = 2**63 - 1
Kind = Literal["change", "event"]


@dataclass(frozen=True)
class EventEntry:
    event: EventRecord
    changes: list[JournalRow]
    """The journal rows it caused, in the order they were written."""

    @property
    def at(self) -> datetime:
        return self.event.received_at


@dataclass(frozen=True)
class ChangeEntry:
    """Journal rows of one cause written in one transaction (not caused by an event of the page)."""

    source: str
    at: datetime
    changes: list[JournalRow]

    @property
    def event_row(self) -> int | None:
        """The inbox row of the event that caused them, if one did."""
        return event_of(self.source)


Entry = EventEntry | ChangeEntry


@dataclass(frozen=True)
class Waiting:
    """What waits for the workspace."""

    events: list[EventRecord] = field(default_factory=list)
    stripe_read: str | None = None
    """The Stripe read of its customer, pending (with when it is due) or in flight."""
    member_limit_job: str | None = None
    """Its member-limit job, while it waits or runs."""

    @property
    def nothing(self) -> bool:
        return not self.events and self.stripe_read is None and self.member_limit_job is None


@dataclass(frozen=True)
class Timeline:
    workspace: WorkspaceSummary
    entries: list[Entry]
    waiting: Waiting
    next_cursor: str | None
    """Where the next (older) page starts; None on the last page."""


@dataclass(frozen=True, order=True)
class Cursor:
    """A position in the merged order: (time, kind, id), newest first; a change sorts before an event at one time."""

    at: datetime
    rank: int  # 1: a journal row, 0: an event
    row_id: int

    def text(self) -> str:
        return f"{self.at.isoformat()}~{self.rank}~{self.row_id}"

    @classmethod
    def parse(cls, text: str | None) -> Cursor | None:
        """A cursor from a link or the command line; anything else starts at the newest."""
        if not text:
            return None
        with contextlib.suppress(ValueError):
            at, rank, row_id = text.split("~")
            if rank in ("0", "1") and row_id.isdigit() and len(row_id) < 19:
                return cls(datetime.fromisoformat(at), int(rank), int(row_id))
        return None

    def events_before(self) -> tuple[datetime, int]:
        """(received_at, id) bound of the events after this position: at its time, all events follow a change."""
        return (self.at, self.row_id) if self.rank == 0 else (self.at, _MAX_ID)

    def changes_before(self) -> tuple[datetime, int]:
        return (self.at, self.row_id) if self.rank == 1 else (self.at, 0)


def tenant_keys(workspace: WorkspaceSummary) -> list[str]:
    """The inbox's tenant keys of the workspace's events: its Stripe customer's, its Clerk organization's."""
    keys = []
    if workspace.stripe_customer_id:
        keys.append(customer_tenant(workspace.stripe_customer_id))
    if workspace.clerk_org_id:
        keys.append(organization_tenant(workspace.clerk_org_id))
    return keys


async def find_workspaces(resources: Resources, query: str, *, by_name: bool = True) -> list[WorkspaceSummary]:
    """By row id, Clerk organization id, Stripe customer id or (``by_name``) a part of its name."""
    async with resources.db.session() as session:
        return await WorkspaceRepository(session).find(query, by_name=by_name)


async def timeline(
    resources: Resources, workspace_id: int, cursor: Cursor | None = None, limit: int = PAGE_SIZE
) -> Timeline | None:
    """A page of the workspace's timeline, newest first; None when no workspace has that id."""
    async with resources.db.session() as session:
        workspace = await WorkspaceRepository(session).get(workspace_id)
        if workspace is None:
            return None
        keys = tenant_keys(workspace)
        journal = JournalRepository(session)
        # Three reads at once, on three connections: the page waits for the slowest, not for their sum.
        events, rows, waiting = await asyncio.gather(
            Inbox(resources.db).of_tenants(keys, cursor.events_before() if cursor else None, limit + 1),
            journal.page(workspace_id, cursor.changes_before() if cursor else None, JOURNAL_READ * limit),
            _waiting(resources, workspace, keys),
        )
        beside = {event_cause(event.id) for event in events}
        page, more = _cut(events, rows, beside, limit, rows_complete=len(rows) < JOURNAL_READ * limit)
        page_events = [item for _, item in page if isinstance(item, EventRecord)]
        caused = await journal.caused_by(
            workspace_id,
            [event_cause(event.id) for event in page_events],
            min((event.received_at for event in page_events), default=datetime.max),
        )
    next_cursor = page[-1][0].text() if more and page else None
    return Timeline(workspace, _entries(page, caused, beside), waiting, next_cursor)


def _cut(
    events: Sequence[EventRecord], rows: Sequence[JournalRow], beside: set[str], limit: int, *, rows_complete: bool
) -> tuple[list[tuple[Cursor, EventRecord | JournalRow]], bool]:
    """The items of the page, newest first, and whether older ones follow.

    A row caused by one of the events read is shown beside its event (on this page or the next), so it takes no
    place of its own. The page ends after ``limit`` entries, or where one of the reads stopped short: past the
    oldest item it returned, the other read may hold items it has not.
    """
    merged = sorted(
        [(Cursor(e.received_at, 0, e.id), e) for e in events] + [(Cursor(r.at, 1, r.id), r) for r in rows],
        key=lambda item: item[0],
        reverse=True,
    )
    ends = [Cursor(events[-1].received_at, 0, events[-1].id)] if len(events) > limit else []
    ends += [Cursor(rows[-1].at, 1, rows[-1].id)] if rows and not rows_complete else []
    horizon = max(ends, default=None)
    page: list[tuple[Cursor, EventRecord | JournalRow]] = []
    shown = 0
    for key, item in merged:
        if shown == limit or (horizon is not None and key < horizon):
            return page, True
        page.append((key, item))
        shown += isinstance(item, EventRecord) or item.source not in beside
    return page, horizon is not None


def _entries(
    page: Sequence[tuple[Cursor, EventRecord | JournalRow]], caused: Sequence[JournalRow], beside: set[str]
) -> list[Entry]:
    by_event: dict[str, list[JournalRow]] = {}
    for row in sorted(caused, key=lambda row: (row.at, row.id)):
        by_event.setdefault(row.source, []).append(row)
    entries: list[Entry] = []
    for _, item in page:
        if isinstance(item, EventRecord):
            entries.append(EventEntry(item, by_event.get(event_cause(item.id), [])))
        elif item.source not in beside:
            last = entries[-1] if entries else None
            if isinstance(last, ChangeEntry) and (last.source, last.at) == (item.source, item.at):
                last.changes.insert(0, item)  # the page is newest first; a group reads in writing order
            else:
                entries.append(ChangeEntry(item.source, item.at, [item]))
    return entries


async def _waiting(resources: Resources, workspace: WorkspaceSummary, keys: list[str]) -> Waiting:
    events = await Inbox(resources.db).unprocessed_of_tenants(keys, WAITING_EVENTS) if keys else []
    if not workspace.stripe_customer_id:
        return Waiting(events)
    subject = f"customer:{workspace.stripe_customer_id}"
    sync = await BillingRepository(resources.db).sync_state(subject)
    if sync is None:
        return Waiting(events)
    read = None
    if sync.in_flight:
        read = f"Stripe read of {subject} in progress since {sync.read_began:%Y-%m-%d %H:%M:%S} UTC"
    elif sync.pending:
        due = f", due {sync.due_at:%Y-%m-%d %H:%M:%S} UTC" if sync.due_at else ""
        read = f"Stripe read of {subject} waiting for its reservation of the API budget{due}"
    job_id = member_limit_job_id(workspace.id, sync_cause(subject, sync.generation))
    name = ApplyWorkspaceMemberLimitJob.name()
    try:
        state = await resources.queue.state(job_id, ApplyWorkspaceMemberLimitJob.queue)
    except QueueUnavailableError:
        return Waiting(events, read, f"{name}: unknown, the queue did not answer")
    return Waiting(events, read, None if state == "absent" else f"{name} after the last Stripe read: {state}")
