"""What every layer knows of the change journal (``workspace_change``): who causes a change, and a dry run's view.

Identity owns the journal's table and writes it (``app/identity/journal``);
the layers below it decide what a change is caused by, so the cause travels
in a context variable, set by whoever opens the unit of work:

- a webhook event's processing (or the sync that covers it): the inbox row,
  ``webhook_event:<id>`` (:func:`event_cause`);
- a job or cron: its class name (``app/queue/execution.py``);
- a command: the command as typed, ``litestar billing reconcile`` (``app/core/commands.py``).

The innermost wins: ``crons run`` runs a cron, which names itself. Code that
writes with none of them (a test, a request of your own) is journaled as
``unknown``.

A dry run (``webhooks replay ID --dry-run``) opens :func:`previewing`: every
journal entry the handler's writes produce is noted there too, so the dry run
reports what would have been journaled, then rolls everything back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

NOT_JOURNALED = {"journal": False}
"""A column's ``info`` for bookkeeping the journal leaves out (a version, a sync time): alone it is no change."""
EVENT_SOURCE_PREFIX = "webhook_event:"
UNKNOWN_CAUSE = "unknown"
_CAUSE: ContextVar[str | None] = ContextVar("journal_cause", default=None)
_PREVIEW: ContextVar[list[JournalEntry] | None] = ContextVar("journal_preview", default=None)


def event_cause(row_id: int) -> str:
    """The journal's ``source`` of a change caused by inbox row ``row_id``."""
    return f"{EVENT_SOURCE_PREFIX}{row_id}"


def event_of(source: str) -> int | None:
    """The inbox row id a ``source`` names, or None (a job, cron or command)."""
    if source.startswith(EVENT_SOURCE_PREFIX) and source[len(EVENT_SOURCE_PREFIX) :].isdigit():
        return int(source[len(EVENT_SOURCE_PREFIX) :])
    return None


def current_cause() -> str:
    return _CAUSE.get() or UNKNOWN_CAUSE


@contextlib.contextmanager
def caused_by(source: str) -> Iterator[None]:
    """What the journal names as the cause of every change written inside the block."""
    token = _CAUSE.set(source[:255])
    try:
        yield
    finally:
        _CAUSE.reset(token)


@dataclass(frozen=True)
class JournalEntry:
    """One row changed: which, whose, and each column changed as ``[stored, new]`` (JSON values)."""

    entity: str
    entity_id: int
    workspace_id: int | None
    changes: Mapping[str, Sequence[Any]]


@contextlib.contextmanager
def previewing() -> Iterator[list[JournalEntry]]:
    """Collect the journal entries written inside the block (a dry run's would-be changes)."""
    entries: list[JournalEntry] = []
    token = _PREVIEW.set(entries)
    try:
        yield entries
    finally:
        _PREVIEW.reset(token)


def is_previewing() -> bool:
    return _PREVIEW.get() is not None


def note(entries: Sequence[JournalEntry]) -> None:
    """Called by the journal's writer with what it journaled: kept only while a dry run collects it."""
    collected = _PREVIEW.get()
    if collected is not None:
        collected.extend(entries)
