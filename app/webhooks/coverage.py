"""What a sync does to the inbox events it covers: the webhooks side of ``SyncedEvents``, for the owning module.

A sync of a subject (billing's Stripe reads) covers the events of that subject
that arrived by the time its read began. It asks here, never writing
``webhook_event`` itself:

- :func:`covered`: whether it covers any (a sync with nothing to cover skips
  its read), when the latest of them arrived (a read that began after that
  covers them all: :func:`newest_covered`), and the last of them stored: the
  cause its journal rows name;
- :func:`mark_covered`: in the sync's own transaction, with what it wrote,
  they are processed; :func:`count_processed` counts them after the commit;
- :func:`fail_covered`: a transient failure counts an attempt of each (so the
  recovery cron sets them aside after ``WEBHOOK_ABANDON_AFTER_ATTEMPTS``);
- :func:`set_aside_covered`: a permanent one sets them all aside, with one alert.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from app.core import tracing
from app.core.commands import plural
from app.core.db import Database
from app.core.metrics import ATTEMPTS_FAILED, EVENTS_PROCESSED, EVENTS_SET_ASIDE, PIPELINE_SECONDS, child
from app.core.sentry import report_message
from app.webhooks.inbox import InboxCoverage, SetAside

logger = logging.getLogger(__name__)

Processed = Sequence[tuple[str, float | None]]
"""(provider, seconds from arrival to processing; None for a replay) of each event a sync marked."""


@dataclass(frozen=True)
class Covered:
    newest_at: datetime | None
    """When the latest of them arrived (None: the sync covers none)."""
    newest: int | None
    """The inbox row id of the last event stored among them: what the sync's changes are journaled as caused by
    (the read found the state that event, and every one before it, announced)."""


async def covered(db: Database, subject: str, read_began: datetime) -> Covered:
    return Covered(*await InboxCoverage(db).covered(subject, read_began))


async def newest_covered(db: Database, subject: str, read_began: datetime) -> datetime | None:
    """When the latest event a sync of ``subject`` whose read began at ``read_began`` covers arrived (None: none)."""
    return (await covered(db, subject, read_began)).newest_at


async def mark_covered(session: AsyncSession, subject: str, read_began: datetime) -> Processed:
    """In the sync's transaction: every event of ``subject`` that arrived by ``read_began`` is processed.

    The sync's span (tracing on) is linked to the trace of each event it covers.
    """
    marked = await InboxCoverage.mark_covered(session, subject, read_began)
    tracing.link_traces(event.trace_context for event in marked)
    return [(event.provider, event.took) for event in marked]


def count_processed(processed: Processed) -> None:
    """After the sync's commit: each event counted processed, its wait observed (a replay's is not)."""
    for provider, took in processed:
        child(EVENTS_PROCESSED, provider).inc()
        if took is not None:
            child(PIPELINE_SECONDS, provider).observe(took)


async def fail_covered(db: Database, provider: str, subject: str, read_began: datetime, error: str) -> int:
    """Count an attempt of each event the failed sync covers; the most attempts any of them has now (0: none)."""
    attempts = await InboxCoverage(db).record_covered_failure(subject, read_began, error)
    if attempts:
        child(ATTEMPTS_FAILED, provider).inc(len(attempts))
    return max(attempts, default=0)


async def set_aside_covered(db: Database, subject: str, read_began: datetime, error: str) -> int:
    """Set aside every event the sync covers, with one alert for them all (committed after it went out)."""
    async with InboxCoverage(db).setting_aside_covered(subject, read_began, error) as rows:
        if rows:
            _alert(subject, rows, error)
    return len(rows)


def _alert(subject: str, events: Sequence[SetAside], error: str) -> None:
    """One Sentry message and one error log line for the events a permanent failure of one sync set aside."""
    first = events[0]
    message = (
        f"{plural(len(events), 'webhook event')} set aside: the read of {subject} failed for good "
        f"(provider={first.provider}, first event_id={first.event_id}, type={first.type}): {error!r}. "
        "Fix the cause, then run `make retry-abandoned` (or resend one from the provider's dashboard)."
    )
    logger.error(message)
    child(EVENTS_SET_ASIDE, first.provider).inc(len(events))
    report_message(
        message,
        level="error",
        tags={"webhook.provider": first.provider, "webhook.subject": subject.partition(":")[0]},
        extras={"subject": subject, "events": len(events), "first_event_id": first.event_id, "last_error": error},
        fingerprint=["webhook-set-aside-sync", first.provider, subject],
    )
