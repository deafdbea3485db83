"""Syncs: a Stripe read of one subject, run as its own job at its reservation of the API budget, covering its events.

A Stripe event is never applied by its own job: that job asks for a sync of
the event's subject (``customer:cus_...``, ``checkout:cs_...``,
``dispute:dp_...``, ``refund:re_...``, ``charge:ch_...``,
``early_fraud_warning:issfr_...``), and the sync marks processed, in the
transaction that writes what it read, every event of that subject that arrived
before its read began. A burst of events about one customer costs one read.

The hand-off (``request_sync``, ``BillingRepository.want_sync``) happens in
Postgres under the ``billing_sync`` row's lock, so no event is stranded: it is
covered by a pending sync (one that begins its read later), by one in flight
whose read began after it arrived, or it starts the next generation. A new
generation reserves slots of the budget (``RateBudget.reserve``) and its
job is queued for their time on the Stripe sync queue: while it waits it holds
no worker slot, no transaction and no lock. Generations of one subject follow
each other, so at most one sync of a subject is in flight (save a sync whose
reservation comes while the one before it still writes: it waits for that one's
lock).

An event whose customer was read after it arrived costs no read, across
subjects too: a sync that reaches a customer whose workspace was written from
a read that began after the latest of its events arrived writes nothing and
covers them (``BillingService.sync_customer``, asked under the customer's
lock). Thin events about a subscription or an invoice billing does not hold
(``thin_events.py``) have such a subject (``subscription:sub_...``,
``invoice:in_...``): its sync reads the object once for its customer, then
syncs that customer; of it and the customer's own sync (a snapshot twin's),
whichever takes the customer's lock second finds it read after its events
arrived: one customer read between them.

A sync that fails:

- permanently (a Stripe 404): every event it covers is set aside, one alert;
- transiently (a 5xx, a timeout): an attempt of each event it covers is
  counted (so the recovery cron sets them aside after
  ``WEBHOOK_ABANDON_AFTER_ATTEMPTS``), and it comes back after the backoff of
  the webhook events' retries (``WEBHOOK_RETRY_LIMIT`` tries a round; then the
  recovery cron queues the events again);
- told to wait (a 429, its reservation not near, more calls needed than its
  reservation held): no attempt counted; it comes back for its reservation;
- Stripe held after an outage (``UPSTREAM_HOLD_AFTER_SUBJECTS`` subjects
  failed in a row; the failure that made it held is one of them) or paused by
  an operator: no attempt counted, nothing sent to Sentry; it comes back when
  the next probe is due (``app.queue.upstreams``), holding nothing meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from datetime import datetime, timedelta
from typing import Any

import msgspec
from sqlalchemy.ext.asyncio import AsyncSession

from app.billing.budget import (
    RESERVATION_EARLY_SECONDS,
    STRIPE,
    BudgetShortfall,
    Reservation,
    stripe_budget,
    stripe_gateway,
)
from app.billing.mirrors import MirrorService
from app.billing.repository import BillingRepository, WantedSync
from app.billing.services import BillingService, BillingSync, NewestEvent
from app.core import tracing
from app.core.journal import caused_by, event_cause
from app.core.resources import Resources
from app.core.sentry import report_exception
from app.identity.seats import set_member_limit
from app.queue.errors import PermanentError, RetryLater
from app.queue.job import UNLIMITED_RETRIES, FromSetting, Job
from app.queue.queues import QueueName
from app.queue.retry import backoff_seconds
from app.webhooks import coverage
from app.webhooks.jobs import ProcessWebhookEventJob
from app.webhooks.processing import describe_error

logger = logging.getLogger(__name__)

CALLS = {
    "customer": 1,
    "checkout": 2,
    "dispute": 2,
    "refund": 2,
    "early_fraud_warning": 2,
    "charge": 1,
    "subscription": 2,
    "invoice": 2,
}
"""Stripe calls a first sync of each kind of subject reserves (a sync that needs more learns it: ``calls``)."""
STALE_MARGIN_SECONDS = 60
"""A read in flight longer than the sync's time limit and this is taken for lost (its worker died)."""


class StripeSyncData(msgspec.Struct, frozen=True):
    subject: str
    generation: int
    calls: int = 1


def sync_job_id(subject: str, generation: int) -> str:
    return f"stripe-sync:{subject}:{generation}"


class SyncComesBack(RetryLater):
    """The sync failed (logged and reported already) or must wait: its job runs again after ``after_seconds``."""

    log_level = logging.INFO


class StripeSyncJob(Job[StripeSyncData]):
    """Reads one subject from Stripe at its reservation of the budget and covers the events that asked for it."""

    queue = QueueName.STRIPE_SYNC
    fair = False  # queued for its reservation of the budget, not by its tenant's turn
    # Its deferrals and its retries are scheduled by the sync itself; the events' rows count the tries.
    retry_limit = UNLIMITED_RETRIES
    timeout_seconds = FromSetting("webhook_job_timeout_seconds")

    async def handle(self, data: StripeSyncData) -> None:
        await run_sync(self.resources, data)


async def request_sync(
    resources: Resources, subject: str, received_at: datetime, request_id: str | None, *, now: bool = False
) -> None:
    """An event that arrived at ``received_at`` asks for a sync of ``subject`` (``SyncedEvents.sync``).

    ``now``: an operator's retry: a new generation at the budget's next free slots, superseding one waiting out
    its backoff.
    """
    repo = BillingRepository(resources.db)
    calls = CALLS.get(subject.partition(":")[0], 1)
    if now:
        wanted: WantedSync | None = await repo.want_sync_now(subject, calls)
    else:
        wanted = await repo.want_sync(subject, received_at, stale_after(resources), calls)
    if wanted is None:
        return  # a pending sync covers it, or one whose read began after the event arrived
    delay = None
    if wanted.new:
        wait = await stripe_budget(resources).reserve(subject, wanted.calls)
        await repo.sync_due(subject, wanted.generation, wait)
        delay = timedelta(seconds=max(wait - RESERVATION_EARLY_SECONDS, 0.0))
    queued = await resources.queue.add(
        StripeSyncJob,
        StripeSyncData(subject, wanted.generation, wanted.calls),
        deduplication_id=sync_job_id(subject, wanted.generation),
        delay=delay,
        request_id=request_id,
    )
    if not wanted.new and queued is not None:  # overdue, and its job was gone (still waiting, e.g. for a hold: no)
        logger.warning(
            "Sync of %s (generation %s) was long overdue: its job is queued again.", subject, wanted.generation
        )


def stale_after(resources: Resources) -> float:
    """How long a read in flight may last before it counts as lost (its worker died): the sync's time limit and more."""
    return resources.settings.webhook_job_timeout_seconds + STALE_MARGIN_SECONDS


async def run_sync(resources: Resources, data: StripeSyncData) -> None:
    subject, generation = data.subject, data.generation
    tracing.annotate({"billing.sync_subject": subject})  # and a link to each event it covers (coverage)
    # Stripe held or paused: back when it may call, holding nothing (its job waiting is not lost: request_sync).
    await STRIPE.of(resources).check(subject)
    # SlotLater: back for its reservation, holding nothing
    reservation = await stripe_budget(resources).take(subject, data.calls)
    sync, repo = _Sync(resources, subject, generation, reservation), BillingRepository(resources.db)
    try:
        processed = await sync.run()
    except BudgetShortfall as short:
        wait = await stripe_budget(resources).reserve(subject, short.calls_made + 1)
        await repo.release_sync(subject, generation, again=True, calls=short.calls_made + 1, due_in=wait)
        raise SyncComesBack(f"{short}: back for a reservation of {short.calls_made + 1}", after_seconds=wait) from short
    except RetryLater as later:  # Stripe answered 429, or another run of it reads: not a failure of the events
        if sync.read_began is not None:
            await repo.release_sync(subject, generation, again=True, due_in=later.after_seconds)
        raise
    except PermanentError as exc:
        if sync.read_began is None:
            raise
        await _set_aside(resources, subject, generation, sync.read_began, exc)
        return
    except Exception as exc:
        if sync.read_began is None:  # before its claim (the database away): the job layer retries it
            raise
        await _failed(resources, subject, generation, sync.read_began, exc)  # SyncComesBack unless the round ended
        return
    if processed is not None:
        coverage.count_processed(processed)
        logger.info("Sync of %s covered %d event(s).", subject, len(processed))


class _Sync:
    """One run of a sync: under its subject's lock, claim the generation, read, write, cover, commit."""

    def __init__(self, resources: Resources, subject: str, generation: int, reservation: Reservation) -> None:
        self.resources, self.subject, self.generation, self.reservation = resources, subject, generation, reservation
        self.read_began: datetime | None = None

    async def run(self) -> coverage.Processed | None:
        """What it covered; None when it had nothing to read (superseded, or its events covered already).

        The claim comes after the subject's lock: a run waiting for the one before it to write is still
        pending, so an event arriving meanwhile waits for its read instead of asking for one more.
        """
        resources, subject, generation = self.resources, self.subject, self.generation
        repo = BillingRepository(resources.db)
        async with resources.db.session() as session:
            await BillingRepository.lock_subject(session, subject)
            claim = await repo.claim_sync(subject, generation, stale_after(resources))
            if claim.stale_in is not None:  # this generation's read runs elsewhere (or its worker was lost)
                raise SyncComesBack(f"Sync of {subject} is read by another run", after_seconds=max(claim.stale_in, 1))
            if claim.read_began is None:
                logger.info("Sync of %s (generation %s) superseded by a later one: nothing to do.", subject, generation)
                return None
            self.read_began = claim.read_began
            covered = await coverage.covered(resources.db, subject, claim.read_began)
            if covered.newest is None:
                logger.info("Sync of %s: its events were covered by an earlier read; no read.", subject)
                await repo.release_sync(subject, generation, again=False)
                return None
            read_began = claim.read_began

            def newest_event() -> Awaitable[datetime | None]:
                return coverage.newest_covered(resources.db, subject, read_began)

            with caused_by(event_cause(covered.newest)):  # what the journal names as the cause of its writes
                cause = sync_cause(subject, generation)
                await read_and_write(resources, session, subject, read_began, self.reservation, cause, newest_event)
                await BillingRepository.sync_done(session, subject, generation, max(self.reservation.made, 1))
                processed = await coverage.mark_covered(session, subject, claim.read_began)
                await session.commit()
        await _relay(resources, session, subject)
        return processed


def sync_cause(subject: str, generation: int) -> str:
    """The run a member-limit job follows (``identity.seats``): one job per sync that changed the limit."""
    return f"sync:{subject}:{generation}"


async def read_and_write(
    resources: Resources,
    session: AsyncSession,
    subject: str,
    read_began: datetime,
    reservation: Reservation | None,
    cause: str,
    newest_event: NewestEvent | None = None,
) -> None:
    """A sync's work on our tables: ``subject`` read from Stripe and written, in ``session`` (which it never commits).

    Without the sync's bookkeeping (its ``billing_sync`` row, the events it
    covers): the sync adds those, a dry run (:func:`preview_sync`) does not.
    ``reservation``: the sync's reserved slots (None: each call waits for a slot,
    as a command's). ``cause``: the run that stages a member-limit job.
    ``newest_event``: the sync's (``BillingService``; None: always read).
    """
    synced = await _read(resources, session, subject, read_began, reservation, newest_event)
    if synced is not None:  # identity owns seats: it re-seats the members after the commit
        await set_member_limit(session, resources.queue, synced.workspace_id, synced.paid_seats, cause=cause)


async def _read(
    resources: Resources,
    session: AsyncSession,
    subject: str,
    read_began: datetime,
    reservation: Reservation | None,
    newest_event: NewestEvent | None,
) -> BillingSync | None:
    """Read the subject and write it; the workspace synced, if any."""
    kind, _, object_id = subject.partition(":")
    gateway = stripe_gateway(resources)
    billing = BillingService(session, gateway, resources.settings.free_plan_member_limit, reservation, newest_event)
    mirrors = MirrorService(session, gateway, reservation)
    if kind == "customer":
        return await billing.sync_customer(object_id, read_began)
    if kind in ("subscription", "invoice"):
        return await billing.sync_customer_of(kind, object_id, read_began)  # type: ignore[arg-type]
    if kind == "checkout":
        return await billing.link_checkout(object_id, read_began)
    if kind in ("dispute", "refund", "early_fraud_warning"):
        await mirrors.sync_object(kind, object_id, read_began)  # type: ignore[arg-type]
    elif kind == "charge":
        await mirrors.sync_refunds_of_charge(object_id, read_began)
    else:
        raise PermanentError(f"No sync reads Stripe subjects of kind {kind!r} ({subject}).")
    return None


async def preview_sync(resources: Resources, session: AsyncSession, subject: str) -> None:
    """A dry run's sync (``SyncedEvents.preview``): the read and the writes in ``session``, which the caller rolls back.

    No ``billing_sync`` generation is claimed and no event covered, so the read
    counts as no sync: a real replay after it reads Stripe again. Its calls pass
    the budget as a command's do.
    """
    read_began = await BillingRepository.clock(session)
    await read_and_write(resources, session, subject, read_began, None, f"preview:{subject}")


async def _relay(resources: Resources, session: Any, subject: str) -> None:
    """Queue the member-limit job the sync staged, now committed; never fails the sync (a worker relays it)."""
    try:
        await resources.queue.relay_outbox(session=session)
    except Exception:
        logger.exception(
            "Relaying the jobs staged by the sync of %s failed; a worker queues them within seconds.", subject
        )


async def _set_aside(
    resources: Resources, subject: str, generation: int, read_began: datetime, exc: PermanentError
) -> None:
    set_aside = await coverage.set_aside_covered(resources.db, subject, read_began, describe_error(exc))
    await BillingRepository(resources.db).release_sync(subject, generation, again=False)
    logger.info("Sync of %s failed for good: %d event(s) set aside.", subject, set_aside)


async def _failed(resources: Resources, subject: str, generation: int, read_began: datetime, exc: Exception) -> None:
    """Count an attempt of each covered event; come back after the events' backoff, or end the round."""
    policy = ProcessWebhookEventJob.retry_policy(resources.settings)
    attempts = await coverage.fail_covered(resources.db, "stripe", subject, read_began, describe_error(exc))
    position = (max(attempts, 1) - 1) % (policy.retry_limit + 1) + 1  # this try's place in its round
    again = attempts > 0 and position <= policy.retry_limit
    delay = backoff_seconds(policy, position) if again else None
    logger.error(
        "Sync of %s failed (%s): %s: %s",
        subject,
        f"events at {attempts} attempts; read again in {delay:.1f} s" if delay is not None else "round over",
        type(exc).__name__,
        exc,
        exc_info=exc,
    )
    report_exception(
        exc,
        tags={"stripe.subject": subject.partition(":")[0], "final": "no" if again else "yes"},
        fingerprint=["stripe-sync-failure", subject.partition(":")[0], type(exc).__qualname__],
    )
    await BillingRepository(resources.db).release_sync(subject, generation, again=again, due_in=delay or 0.0)
    if delay is not None:
        raise SyncComesBack(f"Sync of {subject} failed: {type(exc).__name__}", after_seconds=delay) from exc
