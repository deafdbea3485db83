"""One processing attempt of one inbox event, on one pooled connection.

The attempt is counted by the claim, a statement of its own in autocommit, so
the count survives the rollback of the handler's transaction, which then runs
on the same connection; a failure's error is recorded in autocommit after that
rollback. A session-level advisory lock taken by the claim keeps two workers
from processing one event at once.

No path out of a claim keeps the lock: success releases it in the statement
that sets ``processed_at`` (which holds the row's lock until COMMIT, so a
worker claiming the event in between waits and then sees it processed); a
failure releases it with the error it records; and when the lock's state is
unknown (the claim or the bookkeeping itself failed, or was cancelled) the
connection is dropped, which releases it. While the lock is held the session
carries idle timeouts, so a worker frozen or cut off mid-attempt loses its
locks within ``WEBHOOK_LOCK_IDLE_TIMEOUT_SECONDS`` (30 by default; its host gone
without closing the socket: TCP keepalives, see ``core/db``).

An attempt that raises ``PermanentError`` (or whose stored payload cannot be
read) sets the event aside at once, with its one alert: retrying cannot help.
One that raises ``RetryLater`` (the remote side asked to be called later) is
not a failure: its count is given back, its last error left as it was.

A *synced* event (``SyncedEvents``: Stripe's) is not attempted here at all: its
job asks the owning module for a sync of its subject, which counts attempts,
and marks the event processed with what it read (``app.webhooks.coverage``).

Follow-up jobs the handler staged (``context.queue``) commit with the event;
once the claiming connection is back in the pool they are relayed to the queue
at once. If that fails, or the process dies first, a worker's relay loop
queues them within seconds: the event never waits on Redis.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from app.core import tracing
from app.core.journal import caused_by, event_cause
from app.core.metrics import ATTEMPTS_FAILED, EVENTS_PROCESSED, PIPELINE_SECONDS, child
from app.core.module import loaded_modules
from app.core.request_context import bound_request_id
from app.core.resources import Resources
from app.queue.errors import PermanentError, RetryLater
from app.webhooks.alerts import alert_set_aside
from app.webhooks.handlers import SyncedEvents, WebhookContext, find_handler
from app.webhooks.inbox import AttemptStatements, Claim, InboxCoverage, Unclaimed
from app.webhooks.models import WebhookEvent
from app.webhooks.payload import PayloadError, decode_payload

logger = logging.getLogger(__name__)

_ERROR_MAX_CHARS = 4000

_CANCELLED = "Cancelled: the attempt hit its time limit or a shutdown"


def describe_error(exc: BaseException) -> str:
    message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return message[:_ERROR_MAX_CHARS]


async def process_event(resources: Resources, row_id: int, provider: str | None = None) -> None:
    """Run the provider's handler for inbox row ``row_id`` (or ask for its sync); raise to have the queue retry.

    ``provider``: the row's, when the job knows it (its provider's own job class); else it is read from the row.
    """
    if provider is None:
        peeked = await InboxCoverage(resources.db).peek(row_id)
        provider = peeked.provider if peeked is not None else ""
    handling = find_handler(loaded_modules(resources), provider)
    if isinstance(handling, SyncedEvents) and await _ask_for_sync(resources, handling, row_id):
        return
    async with resources.db.engine.connect() as connection:
        statements = AttemptStatements((await connection.get_raw_connection()).driver_connection, row_id)
        try:
            claim = await statements.claim(f"{resources.settings.webhook_lock_idle_timeout_seconds}s")
        except BaseException:
            await connection.invalidate()  # the lock may be held: only dropping the connection is sure to free it
            raise
        if claim is Unclaimed.BUSY:
            logger.info("Webhook event row %s is being processed by another worker; skipped.", row_id)
            return
        attempt = _Attempt(resources, connection, statements)
        await attempt.run(claim)
    await attempt.relay_staged()


async def _ask_for_sync(resources: Resources, handling: SyncedEvents, row_id: int) -> bool:
    """Ask for a sync covering the event; False when its body names no subject (it is then attempted as itself)."""
    row = await InboxCoverage(resources.db).peek(row_id)
    if row is None or row.done:
        logger.info("Webhook event row %s is processed, set aside or gone; nothing to do.", row_id)
        return True
    subject = row.sync_subject
    if subject is None:
        return False
    _about(row.trace_context, row.provider, row_id, row.type, row.tenant_key)
    with bound_request_id(row.request_id):
        await handling.sync(resources, subject, row.received_at, row.request_id)
    return True


class _Attempt:
    """The handler's transaction on the claiming connection; knows whether the lock is still held."""

    def __init__(self, resources: Resources, connection: AsyncConnection, statements: AttemptStatements) -> None:
        self.resources = resources
        self.connection = connection
        self.statements = statements
        self.row_id = statements.row_id
        self.provider = "unknown"  # the claim's, once claimed
        self.locked = True
        self.committed: tuple[WebhookEvent, AsyncSession] | None = None

    async def run(self, claim: Claim | Unclaimed) -> None:
        if not isinstance(claim, Claim):
            logger.info("Webhook event row %s is processed, set aside or gone; nothing to do.", self.row_id)
            await self._bookkeeping(self.statements.unlock(), unlocks=True)
            return
        self.provider = claim.provider
        _about(claim.trace_context, claim.provider, claim.id, claim.type, claim.tenant_key)
        with bound_request_id(claim.request_id):  # the delivery's: a re-queued event's job came without it
            await self._attempt(claim)

    async def _attempt(self, claim: Claim) -> None:
        try:
            event = _event(claim)
            await self._handle(event)
        except asyncio.CancelledError:
            await self._record_failure(_CANCELLED, permanent=False)
            raise
        except RetryLater:
            # Not a failure (a 429's Retry-After, the Stripe budget saturated): the attempt is given back.
            await self._bookkeeping(self.statements.uncount(unlock=self.locked), unlocks=self.locked)
            raise
        except Exception as exc:
            await self._record_failure(describe_error(exc), permanent=isinstance(exc, PermanentError))
            raise

    async def _handle(self, event: WebhookEvent) -> None:
        handler = find_handler(loaded_modules(self.resources), event.provider)
        if handler is None:
            raise PermanentError(
                f"No handler for {event.provider!r} webhook events in the loaded modules: "
                "list the module that owns them in app/runtime.py (WORKER_MODULES)."
            )
        async with self.resources.db.sessionmaker(bind=self.connection) as session:
            context = WebhookContext(resources=self.resources, session=session, event=event)
            with caused_by(event_cause(event.id)):  # what the change journal names as the cause of its writes
                await handler(context)
                took = await self.statements.mark_processed_and_unlock(session)
            self.locked = False  # released, whether or not the COMMIT below succeeds
            await session.commit()
        self.committed = (event, session)
        child(EVENTS_PROCESSED, event.provider).inc()
        if took is not None:  # None: a replay, whose wait since arrival is no measure of the pipeline
            child(PIPELINE_SECONDS, event.provider).observe(took)

    async def relay_staged(self) -> None:
        """Queue the jobs the handler staged, now committed; never fails the event, which stays processed."""
        if self.committed is None:
            return
        event, session = self.committed
        try:
            await self.resources.queue.relay_outbox(session=session)  # an unavailable queue is logged there
        except Exception:
            logger.exception(
                "Relaying the jobs staged by %s event %s failed (the event stays processed); "
                "those still in job_outbox are queued by a worker within seconds.",
                event.provider,
                event.event_id,
            )

    async def _record_failure(self, error: str, *, permanent: bool) -> None:
        """After the handler's rollback: keep the error (or set the event aside) and release the lock.

        If that fails too, the connection is dropped (taking the lock with it)
        and the handler's error, not this one, goes on to the queue.
        """
        child(ATTEMPTS_FAILED, self.provider).inc()
        if permanent and self.locked:
            await self._set_aside(error)
        else:
            await self._bookkeeping(self.statements.record_error(error, unlock=self.locked), unlocks=self.locked)

    async def _set_aside(self, error: str) -> None:
        """Set aside and alert, committing only after the alert went out (a crash repeats it, never loses it)."""
        try:
            async with self.statements.setting_aside(error) as set_aside:
                if set_aside is not None:
                    alert_set_aside(set_aside)
        except Exception:
            logger.warning(
                "Could not set aside webhook event row %s; dropping its connection.", self.row_id, exc_info=True
            )
            await self.connection.invalidate()
            return
        except asyncio.CancelledError:
            await self.connection.invalidate()
            raise
        await self._bookkeeping(self.statements.unlock(), unlocks=True)

    async def _bookkeeping(self, statement: Awaitable[None], *, unlocks: bool) -> None:
        """One statement in autocommit; if it fails the connection is dropped, which releases the lock too."""
        try:
            await statement
        except Exception:
            logger.warning("Could not record the attempt's outcome; dropping its connection.", exc_info=True)
            await self.connection.invalidate()
            self.locked = False
        except asyncio.CancelledError:
            await self.connection.invalidate()
            raise
        if unlocks:
            self.locked = False


def _about(trace_context: str | None, provider: str, row_id: int, event_type: str, tenant: str | None) -> None:
    """The attempt's span (tracing on) says which event it is for, and links the delivery's trace if it runs in
    another (a replay's, a job queued before the trace was kept)."""
    if tracing.is_on():
        about: dict[str, str | int | None] = {"webhook.provider": provider, "webhook.inbox_id": row_id}
        tracing.annotate({**about, "webhook.event_type": event_type, "webhook.tenant": tenant}, linked=trace_context)


def _event(claim: Claim) -> WebhookEvent:
    """The claimed row as the handler sees it (unprocessed, not set aside, this attempt counted)."""
    try:
        payload = decode_payload(claim.payload)
    except PayloadError as exc:
        raise PermanentError(f"The stored payload cannot be read ({exc}); it was stored by an older intake.") from exc
    return WebhookEvent(
        id=claim.id,
        provider=claim.provider,
        event_id=claim.event_id,
        type=claim.type,
        payload=payload,
        received_at=claim.received_at,
        processed_at=None,
        attempts=claim.attempts,
        last_error=claim.last_error,
        abandoned_at=None,
    )
