"""A replay that changes nothing: today's handler run on a stored event, against today's state, then rolled back.

``litestar webhooks replay ID --dry-run`` and the operations page's "Preview
replay" run it. The handler runs as a real replay would (an applied event's
handler, or a synced event's read of its subject: ``SyncedEvents.preview``)
in a transaction that is always rolled back: nothing is written, no
``processed_at``, no journal row, no job (a follow-up job it stages is
reported, not queued). The session joins that transaction through a
savepoint, so even a handler that commits writes nothing. Its would-be
changes are what it would have journaled (``app/core/journal.py``). A handler
that fails is reported as the error it raised, not sent to Sentry: an
operator asked for it.

A synced event's read is no sync: no generation is claimed and no event
covered, so a real replay after it reads again. Its Stripe calls pass the
budget, as a command's do.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from app.core.commands import plural
from app.core.journal import JournalEntry, caused_by, event_cause, previewing
from app.core.module import loaded_modules
from app.core.redaction import SecretScrubber
from app.core.resources import Resources
from app.queue.outbox import staged_in
from app.webhooks.handlers import EventHandling, SyncedEvents, WebhookContext, find_handler
from app.webhooks.inbox import EventRecord, Inbox
from app.webhooks.models import WebhookEvent
from app.webhooks.operations import OperatorError, find_one
from app.webhooks.payload import PayloadError, decode_payload
from app.webhooks.processing import describe_error

logger = logging.getLogger(__name__)
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")


@dataclass(frozen=True)
class WouldChange:
    """One column of one row: what is stored, what the replay would write."""

    entity: str
    entity_id: int
    column: str
    stored: Any
    would_be: Any


@dataclass(frozen=True)
class Preview:
    event: EventRecord
    changes: list[WouldChange] = field(default_factory=list)
    staged: list[tuple[str, Any]] = field(default_factory=list)
    """Follow-up jobs the handler would queue: (job name, data)."""
    error: str | None = None
    """What the handler raised (secrets scrubbed); nothing of it would be written either."""

    @property
    def rows(self) -> int:
        return len({(change.entity, change.entity_id) for change in self.changes})

    def summary(self) -> str:
        """The command's last line: ``Would change N fields of M rows.``"""
        return f"Would change {plural(len(self.changes), 'field')} of {plural(self.rows, 'row')}."

    def lines(self) -> list[str]:
        """Every line the command prints, the summary last."""
        lines = [
            f"Dry run of {self.event.provider} event {self.event.event_id} (row {self.event.id}, {self.event.type}):"
        ]
        if self.changes:
            header = ("ENTITY", "ID", "COLUMN", "STORED", "WOULD BE")
            cells = [(c.entity, str(c.entity_id), c.column, shown(c.stored), shown(c.would_be)) for c in self.changes]
            widths = [max(len(row[i]) for row in (header, *cells)) for i in range(4)]
            for row in (header, *cells):
                lines.append(
                    "  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[4]])
                )
        lines += [
            f"Would queue {name} ({json.dumps(data, sort_keys=True)}) after the commit." for name, data in self.staged
        ]
        if self.error is not None:
            lines.append(f"The handler would fail: {self.error}")
        lines.append(self.summary())
        return lines


def shown(value: Any) -> str:
    """A journaled value as an operator reads it: null as ``none``, a time in UTC to the second, text as it is."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and _TIME.match(value):
        with contextlib.suppress(ValueError):
            return f"{datetime.fromisoformat(value).astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    return value if isinstance(value, str) else json.dumps(value)


def would_change(entries: Sequence[JournalEntry]) -> list[WouldChange]:
    """The net change of each row the journal entries name: its first stored value, its last new one."""
    merged: dict[tuple[str, int, str], list[Any]] = {}
    for entry in entries:
        for column, (stored, new) in entry.changes.items():
            key = (entry.entity, entry.entity_id, column)
            merged[key] = [merged[key][0] if key in merged else stored, new]
    return [WouldChange(*key, stored, new) for key, (stored, new) in merged.items() if stored != new]


async def preview_replay(resources: Resources, identifier: str, provider: str | None = None) -> Preview:
    """Run the handler of the event ``identifier`` names (row id or event id) and roll it all back."""
    found = await find_one(resources, identifier, provider)
    event = await Inbox(resources.db).get(found.id)
    if event is None:
        raise OperatorError(f"No webhook event with row id or event id {identifier!r}.")
    handling = find_handler(loaded_modules(resources), event.provider)
    if handling is None:
        raise OperatorError(
            f"No module this process loads handles {event.provider} events: list the module that owns them "
            "in app/runtime.py (WORKER_MODULES)."
        )
    entries, staged, error = await _rolled_back(resources, handling, event)
    preview = Preview(event, would_change(entries), staged, error)
    logger.info(
        "Dry run of %s event %s (row %s): %s%s",
        event.provider,
        event.event_id,
        event.id,
        preview.summary(),
        " The handler would fail." if error else "",
    )
    return preview


async def _rolled_back(
    resources: Resources, handling: EventHandling, event: EventRecord
) -> tuple[list[JournalEntry], list[tuple[str, Any]], str | None]:
    error = None
    async with resources.db.engine.connect() as connection:
        transaction = await connection.begin()
        try:
            session = resources.db.sessionmaker(bind=connection, join_transaction_mode="create_savepoint")
            with previewing() as entries, caused_by(event_cause(event.id)):
                try:
                    await _run(resources, handling, session, event)
                    await session.flush()
                except OperatorError:
                    raise
                except Exception as exc:
                    error = SecretScrubber(resources.settings.secret_values()).text(describe_error(exc))
            staged = staged_in(session)
            await session.close()
        finally:
            await transaction.rollback()
    return entries, staged, error


async def _run(resources: Resources, handling: EventHandling, session: Any, event: EventRecord) -> None:
    try:
        payload = decode_payload(event.payload or "")
    except PayloadError as exc:
        raise OperatorError(f"The stored payload cannot be read ({exc}).") from exc
    if isinstance(handling, SyncedEvents):
        subject = event.sync_subject or handling.keys(event.type, payload).subject
        if subject is None:
            raise OperatorError(f"The {event.type} event names no object to read back: a replay would set it aside.")
        if handling.preview is None:
            raise OperatorError(f"The module that syncs {event.provider} events offers no dry run.")
        await handling.preview(resources, session, subject)
        return
    stored = WebhookEvent(
        id=event.id,
        provider=event.provider,
        event_id=event.event_id,
        type=event.type,
        payload=payload,
        received_at=event.received_at,
        processed_at=None,
        attempts=event.attempts,
        last_error=event.last_error,
        abandoned_at=None,
    )
    await handling(WebhookContext(resources=resources, session=session, event=stored))
