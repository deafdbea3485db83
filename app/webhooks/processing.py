"""One processing attempt of one inbox event.

The attempt is counted and its error recorded on a bookkeeping connection in
autocommit, so they survive the rollback of the handler's own transaction. A
session-level advisory lock on that connection keeps two workers from
processing one event at once; a killed worker's connection drops and releases it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sqlalchemy import func, update

from app.core.resources import Resources
from app.queue.errors import PermanentError
from app.webhooks.handlers import WebhookContext, find_handler
from app.webhooks.inbox import discard_if_dead
from app.webhooks.models import WebhookEvent

logger = logging.getLogger(__name__)

# Advisory-lock keys of inbox rows: a constant high part keeps them apart from other users.
_LOCK_BASE = 0x5745 << 48
_ERROR_MAX_CHARS = 4000

_CLAIM = """
WITH lock AS MATERIALIZED (SELECT pg_try_advisory_lock($2) AS got),
counted AS (
    UPDATE webhook_event SET attempts = attempts + 1
    FROM lock
    WHERE webhook_event.id = $1 AND lock.got
      AND webhook_event.processed_at IS NULL AND webhook_event.abandoned_at IS NULL
    RETURNING webhook_event.attempts
)
SELECT lock.got, (SELECT attempts FROM counted) AS attempts FROM lock
"""
_RECORD_ERROR = "UPDATE webhook_event SET last_error = $2 WHERE id = $1"
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
        except BaseException:
            await discard_if_dead(bookkeeping, connection)
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
        await _attempt(resources, row_id, connection)
    finally:
        await _unlock(bookkeeping, connection, lock_key)


async def _attempt(resources: Resources, row_id: int, connection: Any) -> None:
    try:
        await _run_handler(resources, row_id)
    except asyncio.CancelledError:
        await connection.execute(_RECORD_ERROR, row_id, "Cancelled: the attempt hit its time limit or a shutdown")
        raise
    except Exception as exc:
        await connection.execute(_RECORD_ERROR, row_id, describe_error(exc))
        raise


async def _run_handler(resources: Resources, row_id: int) -> None:
    async with resources.db.session() as session:
        event = await session.get(WebhookEvent, row_id)
        if event is None:
            return
        handler = find_handler(resources.modules, event.provider)
        if handler is None:
            raise PermanentError(
                f"No handler for {event.provider!r} webhook events in the loaded modules: "
                "list the module that owns them in app/worker/modules.py."
            )
        context = WebhookContext(resources=resources, session=session, event=event)
        await handler(context)
        await session.execute(
            update(WebhookEvent).where(WebhookEvent.id == row_id).values(processed_at=func.now(), last_error=None)
        )
        await session.commit()
    await context.flush_after_commit()


async def _unlock(bookkeeping: Any, connection: Any, lock_key: int) -> None:
    try:
        await connection.execute(_UNLOCK, lock_key)
    except BaseException:
        # A connection that may still hold the lock must not go back to the pool.
        await bookkeeping.invalidate()
        raise
