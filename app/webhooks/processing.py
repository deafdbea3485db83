"""One processing attempt of one inbox event.

The attempt is counted and its error recorded on a bookkeeping connection in
autocommit, so they survive the rollback of the handler's own transaction. A
session-level advisory lock on that connection keeps two workers from
processing one event at once; a killed worker's connection drops and releases it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

from sqlalchemy import Table, bindparam, func, update

from app.core.resources import Resources
from app.queue.errors import PermanentError
from app.webhooks.handlers import WebhookContext, find_handler
from app.webhooks.inbox import discard_if_dead
from app.webhooks.models import WebhookEvent

logger = logging.getLogger(__name__)

# Advisory-lock keys of inbox rows: a constant high part keeps them apart from other users.
_LOCK_BASE = 0x5745 << 48
_ERROR_MAX_CHARS = 4000

# The claimed row comes back whole: the handler's event is built from it, not read again.
_CLAIM = """
WITH lock AS MATERIALIZED (SELECT pg_try_advisory_lock($2) AS got),
counted AS (
    UPDATE webhook_event SET attempts = attempts + 1
    FROM lock
    WHERE webhook_event.id = $1 AND lock.got
      AND webhook_event.processed_at IS NULL AND webhook_event.abandoned_at IS NULL
    RETURNING webhook_event.id, webhook_event.provider, webhook_event.event_id, webhook_event.type,
              webhook_event.payload, webhook_event.received_at, webhook_event.attempts, webhook_event.last_error
)
SELECT lock.got, counted.* FROM lock LEFT JOIN counted ON true
"""
_RECORD_ERROR = "UPDATE webhook_event SET last_error = $2 WHERE id = $1"
# Built once (a Core statement, no ORM synchronisation): it commits with the handler's own writes.
_TABLE = cast(Table, WebhookEvent.__table__)
_MARK_PROCESSED = (
    update(_TABLE).where(_TABLE.c.id == bindparam("row_id")).values(processed_at=func.now(), last_error=None)
)
_UNLOCK = "SELECT pg_advisory_unlock($1)"


def describe_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:_ERROR_MAX_CHARS]


async def process_event(resources: Resources, row_id: int) -> None:
    """Run the provider's handler for inbox row ``row_id``; raise to have the queue retry."""
    lock_key = _LOCK_BASE + row_id
    async with resources.db.engine.connect() as bookkeeping:
        connection: Any = (await bookkeeping.get_raw_connection()).driver_connection
        try:
            await _claimed_attempt(resources, row_id, bookkeeping, connection, lock_key)
        except BaseException as exc:
            await discard_if_dead(bookkeeping, connection, exc)
            raise


async def _claimed_attempt(resources: Resources, row_id: int, bookkeeping: Any, connection: Any, lock_key: int) -> None:
    claim = await connection.fetchrow(_CLAIM, row_id, lock_key)
    if not claim["got"]:
        logger.info("Webhook event row %s is being processed by another worker; skipped.", row_id)
        return
    try:
        if claim["attempts"] is None:
            logger.info("Webhook event row %s is processed, set aside or gone; nothing to do.", row_id)
            return
        await _attempt(resources, _event(claim), connection)
    finally:
        await _unlock(bookkeeping, connection, lock_key)


def _event(claim: Any) -> WebhookEvent:
    """The claimed row as the handler sees it (unprocessed, not set aside, this attempt counted)."""
    return WebhookEvent(
        id=claim["id"],
        provider=claim["provider"],
        event_id=claim["event_id"],
        type=claim["type"],
        payload=claim["payload"],
        received_at=claim["received_at"],
        processed_at=None,
        attempts=claim["attempts"],
        last_error=claim["last_error"],
        abandoned_at=None,
    )


async def _attempt(resources: Resources, event: WebhookEvent, connection: Any) -> None:
    row_id = event.id
    try:
        await _run_handler(resources, event)
    except asyncio.CancelledError:
        await connection.execute(_RECORD_ERROR, row_id, "Cancelled: the attempt hit its time limit or a shutdown")
        raise
    except Exception as exc:
        await connection.execute(_RECORD_ERROR, row_id, describe_error(exc))
        raise


async def _run_handler(resources: Resources, event: WebhookEvent) -> None:
    handler = find_handler(resources.modules, event.provider)
    if handler is None:
        raise PermanentError(
            f"No handler for {event.provider!r} webhook events in the loaded modules: "
            "list the module that owns them in app/worker/modules.py."
        )
    async with resources.db.session() as session:
        context = WebhookContext(resources=resources, session=session, event=event)
        await handler(context)
        await session.execute(_MARK_PROCESSED, {"row_id": event.id})
        await session.commit()
    await context.flush_after_commit()


async def _unlock(bookkeeping: Any, connection: Any, lock_key: int) -> None:
    try:
        await connection.execute(_UNLOCK, lock_key)
    except BaseException:
        # A connection that may still hold the lock must not go back to the pool.
        await bookkeeping.invalidate()
        raise
