"""Inbox upkeep shared by the crons and the operator commands: recover, set aside, retain, reopen."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from app.core import tracing
from app.core.module import loaded_modules
from app.core.resources import Resources
from app.webhooks.alerts import alert_set_aside
from app.webhooks.inbox import InboxUpkeep
from app.webhooks.jobs import queue_processing, queue_processing_many

logger = logging.getLogger(__name__)

RECOVERY_PAGE_SIZE = 500
RETENTION_BATCH_SIZE = 5000


@dataclass
class RecoveryReport:
    requeued: int = 0
    already_queued: int = 0
    set_aside: int = 0


async def recover(resources: Resources, now: datetime | None = None) -> RecoveryReport:
    """Queue again every pending event older than the recovery delay; set aside exhausted ones.

    A synced event's job asks for a sync of its subject that covers every event of it that arrived by then, so
    of a subject's pending events only the newest is queued again, after the last page, for all of them (a
    Stripe outage's backlog costs a tick one job per customer, not one per event); the others, a page at a time.
    """
    settings = resources.settings
    cutoff = (now or datetime.now(UTC)) - timedelta(seconds=settings.webhook_recovery_after_seconds)
    report, inbox = RecoveryReport(), InboxUpkeep(resources.db)
    newest: dict[tuple[str, str], Any] = {}  # (provider, subject) -> its newest pending row
    after = (datetime.min.replace(tzinfo=UTC), 0)
    while True:
        rows = await inbox.pending_page(cutoff, after, RECOVERY_PAGE_SIZE)
        exhausted = [r["id"] for r in rows if r["attempts"] >= settings.webhook_abandon_after_attempts]
        if exhausted:
            report.set_aside += await _set_aside(inbox, exhausted)
        alone = []
        for row in rows:  # oldest first
            if row["id"] in exhausted:
                continue
            if row["sync_subject"] is None:
                alone.append(row)
            else:
                newest[(row["provider"], row["sync_subject"])] = row
        await _queue_again(resources, alone, report)
        if len(rows) < RECOVERY_PAGE_SIZE:
            break
        after = (rows[-1]["received_at"], rows[-1]["id"])
    synced = sorted(newest.values(), key=lambda row: (row["received_at"], row["id"]))
    for start in range(0, len(synced), RECOVERY_PAGE_SIZE):
        await _queue_again(resources, synced[start : start + RECOVERY_PAGE_SIZE], report)
    return report


async def _queue_again(resources: Resources, rows: list[Any], report: RecoveryReport) -> None:
    due = [(row["provider"], row["id"], row["tenant_key"], row["request_id"]) for row in rows]
    traces = {row["id"]: row["trace_context"] for row in rows}  # each job continues its delivery's trace
    queued = await queue_processing_many(resources.queue, due, trace_contexts=traces)  # one round trip per provider
    report.requeued += sum(queued)
    report.already_queued += len(queued) - sum(queued)


async def _set_aside(inbox: InboxUpkeep, row_ids: list[int]) -> int:
    """Set the rows aside and alert once for each, committing only after the alerts went out."""
    async with inbox.setting_aside(row_ids) as set_aside:
        for event in set_aside:
            alert_set_aside(event)
    return len(set_aside)


async def delete_old_processed(resources: Resources, now: datetime | None = None) -> int:
    """Delete processed events past retention in short batches, each its own transaction."""
    days = resources.settings.webhook_event_retention_days
    cutoff = (now or datetime.now(UTC)) - timedelta(days=days)
    deleted, inbox = 0, InboxUpkeep(resources.db)
    while True:
        batch = await inbox.delete_processed_batch(cutoff, RETENTION_BATCH_SIZE)
        deleted += batch
        if batch < RETENTION_BATCH_SIZE:
            return deleted


async def delete_past_retention(resources: Resources, now: datetime | None = None) -> dict[str, int]:
    """What each loaded module keeps for a time (``MODULE.retention``), deleted past it: what -> how many rows."""
    now = now or datetime.now(UTC)
    return {
        what: await delete(resources, now)
        for module in loaded_modules(resources)
        for what, delete in module.retention.items()
    }


async def reopen_abandoned(resources: Resources, row_id: int | None = None) -> list[int]:
    """Give set-aside events their attempts back and queue them; returns the reopened row ids."""
    reopened = await InboxUpkeep(resources.db).reopen(row_id)
    for row in reopened:
        try:
            with tracing.resumed(row["trace_context"], "reopen webhook event"):  # queued in the delivery's trace
                await queue_processing(
                    resources.queue,
                    row["provider"],
                    row["id"],
                    tenant_key=row["tenant_key"],
                    request_id=row["request_id"],
                )
        except Exception as exc:  # reopened anyway: the recovery cron queues it
            logger.warning("Reopened row %s but could not queue it now (%s).", row["id"], exc)
    return [row["id"] for row in reopened]
