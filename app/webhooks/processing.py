"""One processing attempt of one inbox event, on one pooled connection.

The attempt is counted by the claim, a statement of its own in autocommit, so
the count survives the rollback of the handler's transaction, which then runs
on the same connection; a failure's error is recorded in autocommit after that
rollback. A session-level advisory lock taken by the claim keeps two workers
from processing one event at once; a killed worker's connection drops and
releases it.

Success releases the lock inside the handler's transaction, in the statement
that sets ``processed_at``: that statement holds the row's lock until COMMIT,
so a worker that claims the event in between waits on the row and then sees it
processed. One round trip fewer than unlocking after COMMIT.

Follow-up jobs the handler staged (``context.queue``) commit with the event;
once the claiming connection is back in the pool they are relayed to the queue
at once. If that fails, or the process dies first, a worker's relay loop
queues them within seconds: the event never waits on Redis.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from app.core.resources import Resources
from app.queue.errors import PermanentError, QueueUnavailableError
from app.webhooks.handlers import WebhookContext, find_handler
from app.webhooks.inbox import discard_if_dead
from app.webhooks.models import WebhookEvent

logger = logging.getLogger(__name__)

# Advisory-lock keys of inbox rows: a constant high part keeps them apart from other users.
_LOCK_BASE = 0x5745 << 48
_ERROR_MAX_CHARS = 4000

# The claimed row comes back whole: the handler's event is built from it, not read again.
# "coalesce(...) IS NULL" is "processed_at IS NULL AND abandoned_at IS NULL" in a form the planner cannot match
# to the partial index of pending rows: it must find the row by its primary key, not by scanning every
# pending row (without fresh statistics it did, and a backlog of N events cost O(N) per claim).
_CLAIM = """
WITH lock AS MATERIALIZED (SELECT pg_try_advisory_lock($2) AS got),
counted AS (
    UPDATE webhook_event SET attempts = attempts + 1
    FROM lock
    WHERE webhook_event.id = $1 AND lock.got
      AND coalesce(webhook_event.processed_at, webhook_event.abandoned_at) IS NULL
    RETURNING webhook_event.id, webhook_event.provider, webhook_event.event_id, webhook_event.type,
              webhook_event.payload, webhook_event.received_at, webhook_event.attempts, webhook_event.last_error
)
SELECT lock.got, counted.* FROM lock LEFT JOIN counted ON true
"""
# Reading from `marked` makes the row update (and its row lock) happen before the unlock.
_MARK_PROCESSED_AND_UNLOCK = text(
    """
WITH marked AS (
    UPDATE webhook_event SET processed_at = now(), last_error = NULL WHERE id = :row_id RETURNING id
)
SELECT pg_advisory_unlock(:lock_key) FROM (SELECT count(*) FROM marked) AS done
"""
)
_RECORD_ERROR_AND_UNLOCK = """
WITH recorded AS (UPDATE webhook_event SET last_error = $2 WHERE id = $1 RETURNING id)
SELECT pg_advisory_unlock($3) FROM (SELECT count(*) FROM recorded) AS done
"""
_RECORD_ERROR = "UPDATE webhook_event SET last_error = $2 WHERE id = $1"
_UNLOCK = "SELECT pg_advisory_unlock($1)"
_CANCELLED = "Cancelled: the attempt hit its time limit or a shutdown"


def describe_error(exc: BaseException) -> str:
    message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return message[:_ERROR_MAX_CHARS]


async def process_event(resources: Resources, row_id: int) -> None:
    """Run the provider's handler for inbox row ``row_id``; raise to have the queue retry."""
    async with resources.db.engine.connect() as connection:
        driver: Any = (await connection.get_raw_connection()).driver_connection
        try:
            processed = await _claimed_attempt(resources, row_id, connection, driver)
        except BaseException as exc:
            await discard_if_dead(connection, driver, exc)
            raise
    if processed is not None:
        await processed.relay_staged()


async def _claimed_attempt(
    resources: Resources, row_id: int, connection: AsyncConnection, driver: Any
) -> _Attempt | None:
    """The attempt, once its transaction committed; ``None`` when there was nothing to process."""
    lock_key = _LOCK_BASE + row_id
    claim = await driver.fetchrow(_CLAIM, row_id, lock_key)
    if not claim["got"]:
        logger.info("Webhook event row %s is being processed by another worker; skipped.", row_id)
        return None
    if claim["attempts"] is None:
        logger.info("Webhook event row %s is processed, set aside or gone; nothing to do.", row_id)
        await _unlock(connection, driver, lock_key)
        return None
    attempt = _Attempt(resources, _event(claim), connection, lock_key)
    try:
        await attempt.run()
    except asyncio.CancelledError:
        await attempt.record_failure(driver, _CANCELLED)
        raise
    except Exception as exc:
        await attempt.record_failure(driver, describe_error(exc))
        raise
    return attempt


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


class _Attempt:
    """The handler's transaction on the claiming connection; knows whether the lock is still held."""

    def __init__(self, resources: Resources, event: WebhookEvent, connection: AsyncConnection, lock_key: int) -> None:
        self.resources = resources
        self.event = event
        self.connection = connection
        self.lock_key = lock_key
        self.locked = True
        self.session: AsyncSession | None = None

    async def run(self) -> None:
        handler = find_handler(self.resources.modules, self.event.provider)
        if handler is None:
            raise PermanentError(
                f"No handler for {self.event.provider!r} webhook events in the loaded modules: "
                "list the module that owns them in app/worker/modules.py."
            )
        async with self.resources.db.sessionmaker(bind=self.connection) as session:
            context = WebhookContext(resources=self.resources, session=session, event=self.event)
            await handler(context)
            await session.execute(_MARK_PROCESSED_AND_UNLOCK, {"row_id": self.event.id, "lock_key": self.lock_key})
            self.locked = False  # released, whether or not the COMMIT below succeeds
            await session.commit()
        self.session = session

    async def relay_staged(self) -> None:
        """Queue the jobs the handler staged, now committed; never fails the event, which stays processed."""
        if self.session is None:
            return
        try:
            await self.resources.queue.relay_outbox(session=self.session)
        except QueueUnavailableError as exc:
            logger.warning(
                "Jobs staged by %s event %s wait in job_outbox: %s A worker queues them once Redis answers.",
                self.event.provider,
                self.event.event_id,
                exc,
            )
        except Exception:
            logger.exception(
                "Relaying the jobs staged by %s event %s failed (the event stays processed); "
                "those still in job_outbox are queued by a worker within seconds.",
                self.event.provider,
                self.event.event_id,
            )

    async def record_failure(self, driver: Any, error: str) -> None:
        """After the handler's rollback: keep the error for operators and release the lock if still held.

        If that fails too, the connection is dropped (taking the lock with it)
        and the handler's error, not this one, goes on to the queue.
        """
        try:
            if self.locked:
                await driver.fetchval(_RECORD_ERROR_AND_UNLOCK, self.event.id, error, self.lock_key)
                self.locked = False
            else:
                await driver.execute(_RECORD_ERROR, self.event.id, error)
        except Exception:
            logger.warning(
                "Could not record the failure of webhook event row %s; dropping its connection.",
                self.event.id,
                exc_info=True,
            )
            await self.connection.invalidate()


async def _unlock(connection: AsyncConnection, driver: Any, lock_key: int) -> None:
    try:
        await driver.execute(_UNLOCK, lock_key)
    except BaseException:
        # A connection that may still hold the lock must not go back to the pool.
        await connection.invalidate()
        raise
