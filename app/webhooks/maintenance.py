"""Inbox upkeep shared by the crons and the operator commands: recover, set aside, retain, reopen."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from app.core.resources import Resources
from app.webhooks.alerts import alert_set_aside
from app.webhooks.inbox import driver_connection, event_lock_key
from app.webhooks.jobs import queue_processing, queue_processing_many

logger = logging.getLogger(__name__)

RECOVERY_PAGE_SIZE = 500
RETENTION_BATCH_SIZE = 5000

# Pending rows by arrival, through the partial index ix_webhook_event_pending (keyset paging).
_PENDING_PAGE = """
SELECT id, provider, event_id, type, attempts, last_error, received_at FROM webhook_event
WHERE processed_at IS NULL AND abandoned_at IS NULL AND received_at < $1
  AND received_at >= $2 AND (received_at > $2 OR id > $3)
ORDER BY received_at, id
LIMIT $4
"""
# By primary key: coalesce(...) IS NULL keeps the planner off the partial index of every pending row.
# The event's advisory lock (held by a running attempt) is taken for the transaction, so a set-aside never
# races an attempt: a row being processed is skipped and looked at again on the next tick.
_SET_ASIDE = """
UPDATE webhook_event SET abandoned_at = now()
WHERE id = ANY($1::bigint[]) AND coalesce(abandoned_at, processed_at) IS NULL
  AND pg_try_advisory_xact_lock($2::bigint + id)
RETURNING id, provider, event_id, type, attempts, last_error
"""
_RETENTION_BATCH = """
DELETE FROM webhook_event WHERE id IN (
    SELECT id FROM webhook_event
    WHERE processed_at IS NOT NULL AND processed_at < $1 AND abandoned_at IS NULL
    ORDER BY processed_at
    LIMIT $2
)
"""
_REOPEN = """
UPDATE webhook_event SET abandoned_at = NULL, attempts = 0
WHERE abandoned_at IS NOT NULL AND processed_at IS NULL AND ($1::bigint IS NULL OR id = $1)
RETURNING id
"""


@dataclass
class RecoveryReport:
    requeued: int = 0
    already_queued: int = 0
    set_aside: int = 0


async def recover(resources: Resources, now: datetime | None = None) -> RecoveryReport:
    """Queue again every pending event older than the recovery delay; set aside exhausted ones."""
    settings = resources.settings
    cutoff = (now or datetime.now(UTC)) - timedelta(seconds=settings.webhook_recovery_after_seconds)
    report = RecoveryReport()
    last_received, last_id = datetime.min.replace(tzinfo=UTC), 0
    while True:
        async with driver_connection(resources.db) as connection:
            rows = await connection.fetch(_PENDING_PAGE, cutoff, last_received, last_id, RECOVERY_PAGE_SIZE)
            exhausted = [r["id"] for r in rows if r["attempts"] >= settings.webhook_abandon_after_attempts]
            if exhausted:
                report.set_aside += await _set_aside(connection, exhausted)
        due = [row["id"] for row in rows if row["id"] not in exhausted]
        queued = await queue_processing_many(resources.queue, due)  # one round trip per page, not one per event
        report.requeued += sum(queued)
        report.already_queued += len(queued) - sum(queued)
        if len(rows) < RECOVERY_PAGE_SIZE:
            return report
        last_received, last_id = rows[-1]["received_at"], rows[-1]["id"]


async def _set_aside(connection: Any, row_ids: list[int]) -> int:
    """Set the rows aside and alert once for each, committing only after the alerts went out.

    A crash before the COMMIT leaves the rows pending, so the next tick sets them
    aside and alerts again: an alert may repeat, but is never lost. A concurrent
    tick waits on the row locks, then finds them set aside and alerts nothing.
    """
    async with connection.transaction():
        set_aside = await connection.fetch(_SET_ASIDE, row_ids, event_lock_key(0))
        for row in set_aside:
            alert_set_aside(row)
    return len(set_aside)


async def delete_old_processed(resources: Resources, now: datetime | None = None) -> int:
    """Delete processed events past retention in short batches, each its own transaction."""
    days = resources.settings.webhook_event_retention_days
    cutoff = (now or datetime.now(UTC)) - timedelta(days=days)
    deleted = 0
    while True:
        async with driver_connection(resources.db) as connection:
            status = await connection.execute(_RETENTION_BATCH, cutoff, RETENTION_BATCH_SIZE)
        batch = int(status.split()[-1])
        deleted += batch
        if batch < RETENTION_BATCH_SIZE:
            return deleted


async def reopen_abandoned(resources: Resources, row_id: int | None = None) -> list[int]:
    """Give set-aside events their attempts back and queue them; returns the reopened row ids."""
    async with driver_connection(resources.db) as connection:
        rows = await connection.fetch(_REOPEN, row_id)
    reopened = [row["id"] for row in rows]
    for reopened_id in reopened:
        try:
            await queue_processing(resources.queue, reopened_id)
        except Exception as exc:  # reopened anyway: the recovery cron queues it
            logger.warning("Reopened row %s but could not queue it now (%s).", reopened_id, exc)
    return reopened
