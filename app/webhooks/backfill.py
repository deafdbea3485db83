"""Gap detection and backfill: the events a provider still lists but the inbox never received.

A provider stops redelivering after a while (Stripe after about three days): if
its deliveries failed all that time (an endpoint switched off, a secret rotated
wrongly), the events are lost unless someone asks for them. A provider's module
offers an :class:`EventSource` (on its ``EventRoutes``); the backfill pages
through it, stores each event the inbox lacks exactly as intake stores it (the
same decoding rules, the same row, the same job) and, when it stored any, sends
one alert naming how many and the oldest. Events already in the inbox are left
as they are (a set-aside one is not reopened: that is the operator's call).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec

from app.core.commands import parse_duration, plural
from app.core.metrics import EVENTS_BACKFILLED, child
from app.core.module import FeatureModule, loaded_modules
from app.core.resources import Resources
from app.core.sentry import report_message
from app.core.tracing import current_trace_context
from app.webhooks.event_source import EventSource, ListedEvent
from app.webhooks.handlers import StoredKeys, stored_keys
from app.webhooks.inbox import Inbox
from app.webhooks.jobs import queue_processing
from app.webhooks.payload import PayloadError, decode_payload, encode_for_inbox
from app.webhooks.verification import VerifiedEvent

logger = logging.getLogger(__name__)


@dataclass
class BackfillReport:
    label: str
    dry_run: bool
    stored: int = 0
    already: int = 0
    oldest: ListedEvent | None = None
    skipped: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """``Backfilled N Stripe events (M already in the inbox).`` (``Would backfill`` with ``--dry-run``)."""
        verb = "Would backfill" if self.dry_run else "Backfilled"
        return f"{verb} {plural(self.stored, f'{self.label} event')} ({self.already} already in the inbox)."


def event_sources(modules: Sequence[FeatureModule]) -> dict[str, EventSource]:
    """Provider -> the event source of the module that handles its events, for the providers that have one."""
    sources: dict[str, EventSource] = {}
    for module in modules:
        for provider, handler in module.webhook_handlers.items():
            source = getattr(handler, "backfill", None)
            if source is not None:
                sources.setdefault(provider, source)
    return sources


def parse_since(value: str, now: datetime) -> datetime:
    """``72h``, ``30m``, ``7d`` before ``now``, or an ISO 8601 time (UTC unless it says otherwise)."""
    duration = parse_duration(value)
    return now - duration if duration is not None else parse_time(value)


def parse_time(value: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{value!r} is neither a duration (72h, 30m, 7d) nor an ISO 8601 time.") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


async def backfill(
    resources: Resources, provider: str, source: EventSource, since: datetime, until: datetime, *, dry_run: bool = False
) -> BackfillReport:
    """Store the listed events the inbox lacks; alert once if any were missing (never on a dry run)."""
    report, inbox = BackfillReport(source.label, dry_run), Inbox(resources.db)
    keys = stored_keys(loaded_modules(resources), provider)
    async for page in source.pages(resources, since, until):
        missing = await inbox.missing(provider, [event.event_id for event in page])
        report.already += len(page) - len(missing)
        for event in page:
            stored = event.event_id in missing and (dry_run or await _store(resources, keys, provider, event, report))
            if stored:
                report.stored += 1
                if report.oldest is None or event.created < report.oldest.created:
                    report.oldest = event
    if report.stored and not dry_run:
        _alert(provider, report)
    return report


async def _store(
    resources: Resources, keys: StoredKeys, provider: str, event: ListedEvent, report: BackfillReport
) -> bool:
    """As intake stores a delivery: the same checks, encoding and keys, one row per event, its job queued."""
    try:
        raw = _json(event.payload)
        verified = VerifiedEvent.of(event.event_id, event.event_type, decode_payload(raw), raw)
    except PayloadError as exc:
        report.skipped.append(event.event_id)
        logger.error("Backfill skipped %s event %s: %s", provider, event.event_id, exc)
        return False
    text = encode_for_inbox(verified.payload, raw, nul_replaced=verified.nul_replaced)
    key = await keys(resources, verified.event_type, verified.payload)
    stored = await Inbox(resources.db).store(
        provider,
        verified.event_id,
        verified.event_type,
        text,
        tenant_key=key.tenant,
        sync_subject=key.subject,
        trace_context=current_trace_context(),  # the backfill's run: the event's story starts there
    )
    if stored.outcome != "inserted":  # delivered meanwhile
        report.already += 1
        return False
    child(EVENTS_BACKFILLED, provider).inc()
    try:
        await queue_processing(
            resources.queue, provider, stored.row_id, tenant_key=stored.tenant_key, request_id=stored.request_id
        )
    except Exception as exc:  # stored: the recovery cron queues it
        logger.warning("Backfilled %s event %s but could not queue it (%s).", provider, event.event_id, exc)
    return True


def _json(payload: dict[str, Any]) -> bytes:
    return msgspec.json.encode(payload)


def _alert(provider: str, report: BackfillReport) -> None:
    """One alert: a Sentry message and an error log line. Events are being lost upstream."""
    oldest = report.oldest
    assert oldest is not None
    message = (
        f"Webhook gap: {plural(report.stored, f'{report.label} event')} that {report.label} lists never reached the "
        f"inbox (the oldest {oldest.event_id}, {oldest.event_type}, created {oldest.created:%Y-%m-%d %H:%M} UTC); "
        "backfilled now. Deliveries are being lost upstream: check the webhook endpoint in the provider's "
        "dashboard (disabled? failing?) and the signing secret (rotated?)."
    )
    logger.error(message)
    report_message(
        message,
        level="error",
        tags={"webhook.provider": provider},
        extras={"backfilled": report.stored, "oldest_event_id": oldest.event_id},
        fingerprint=["webhook-gap", provider],
    )
