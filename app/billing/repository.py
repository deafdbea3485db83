"""Billing's repository: every statement on billing's tables (syncs and the mirrors of Stripe objects).

The workspace row is identity's: billing reads and writes its billing columns
through ``app/identity/billing_state.py``, and sets its member limit through
identity's seats service. The statements of a sync's hot path are built once.

Syncs (``billing_sync``) are handed off under the row's lock, in autocommit:
:meth:`BillingRepository.want_sync` (an event asks), :meth:`claim_sync` (a
sync begins its read), :meth:`release_sync` (it stops without writing) and,
in the sync's own transaction, :meth:`sync_done`. See ``app/billing/sync.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import cast

from sqlalchemy import func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.billing.models import BillingDispute, BillingFraudWarning, BillingRefund, StripeMirrorColumns
from app.billing.stripe_objects import MirroredObject, MirrorKind
from app.core.db import Database, driver_connection

# Advisory-lock classes of Stripe customers and of sync subjects (two-key locks: apart from every one-key lock,
# e.g. the inbox's).
_CUSTOMER_LOCK_CLASS = 0x5354
_SUBJECT_LOCK_CLASS = 0x5355
_LOCK_CUSTOMER = text(f"SELECT pg_advisory_xact_lock({_CUSTOMER_LOCK_CLASS}, hashtext(:customer_id))")
_LOCK_SUBJECT = text(f"SELECT pg_advisory_xact_lock({_SUBJECT_LOCK_CLASS}, hashtext(:subject))")

# An event asks for a sync of its subject. Under the row's lock (the upsert's): a pending sync (it begins its
# read later) covers it; so does one whose read began after the event arrived, until that read is stale (its
# worker lost); else a new generation is wanted. Returns the new generation, or a pending one overdue by more
# than the staleness (its job lost: queue it again), or nothing (covered).
_WANT_SYNC = """
WITH wanted AS (
    INSERT INTO billing_sync (subject, generation, pending, calls, due_at) VALUES ($1, 1, true, $4, clock_timestamp())
    ON CONFLICT (subject) DO UPDATE SET generation = billing_sync.generation + 1, pending = true,
        due_at = clock_timestamp()
    WHERE NOT billing_sync.pending AND NOT (
        billing_sync.in_flight_generation IS NOT NULL AND billing_sync.read_began >= $2
        AND billing_sync.read_began > clock_timestamp() - make_interval(secs => $3))
    RETURNING generation, calls, true AS new
)
SELECT generation, calls, new FROM wanted
UNION ALL
SELECT generation, calls, false FROM billing_sync
WHERE subject = $1 AND pending AND due_at < clock_timestamp() - make_interval(secs => $3)
  AND NOT EXISTS (SELECT 1 FROM wanted)
"""
# An operator asks for a read now: a new generation whatever is pending (the pending one, waiting out a
# backoff, finds itself superseded) or in flight.
_WANT_SYNC_NOW = """
INSERT INTO billing_sync (subject, generation, pending, calls, due_at) VALUES ($1, 1, true, $2, clock_timestamp())
ON CONFLICT (subject) DO UPDATE SET generation = billing_sync.generation + 1, pending = true,
    due_at = clock_timestamp()
RETURNING generation, calls, true AS new
"""
_DUE = (
    "UPDATE billing_sync SET due_at = clock_timestamp() + make_interval(secs => $3) "
    "WHERE subject = $1 AND generation = $2"
)
# A sync of generation $2 begins its read; again only once an earlier run's read of it is stale (its worker was
# lost mid-read). Returns when the read begins, or how long until an earlier run's read of it is stale, or
# nothing at all (superseded by a later generation, or not wanted any more).
_CLAIM_SYNC = """
WITH claimed AS (
    UPDATE billing_sync SET pending = false, in_flight_generation = $2, read_began = clock_timestamp()
    WHERE subject = $1 AND generation = $2 AND (pending OR (
        in_flight_generation = $2 AND read_began < clock_timestamp() - make_interval(secs => $3)))
    RETURNING read_began
)
SELECT read_began, NULL::float AS stale_in FROM claimed
UNION ALL
SELECT NULL, extract(epoch FROM read_began + make_interval(secs => $3) - clock_timestamp())::float FROM billing_sync
WHERE subject = $1 AND generation = $2 AND in_flight_generation = $2 AND NOT EXISTS (SELECT 1 FROM claimed)
"""
# It stops without writing: pending again ($3: it comes back, due in $5 s) unless superseded, with the calls it
# needs.
_RELEASE_SYNC = """
UPDATE billing_sync SET pending = pending OR ($3 AND generation = $2), in_flight_generation = NULL,
       calls = greatest(calls, $4),
       due_at = CASE WHEN $3 AND generation = $2 THEN clock_timestamp() + make_interval(secs => $5) ELSE due_at END
WHERE subject = $1 AND in_flight_generation = $2
"""
_SYNC_STATE = """
SELECT subject, generation, pending, in_flight_generation IS NOT NULL AS in_flight, due_at, read_began
FROM billing_sync WHERE subject = $1
"""
_SYNC_DONE = text(
    "UPDATE billing_sync SET in_flight_generation = NULL, calls = :calls "
    "WHERE subject = :subject AND in_flight_generation = :generation"
)

_MIRRORS: dict[MirrorKind, type[BillingDispute] | type[BillingRefund] | type[BillingFraudWarning]] = {
    "dispute": BillingDispute,
    "refund": BillingRefund,
    "early_fraud_warning": BillingFraudWarning,
}
# The customer of an object billing holds (a thin event names only the object): the workspace synced with the
# subscription (ix_workspace_subscription_id), or the workspace of a mirrored object.
_CUSTOMER_HOLDING: dict[str, str] = {
    "subscription": (
        "SELECT stripe_customer_id FROM workspace WHERE subscription_id = $1 AND stripe_customer_id IS NOT NULL LIMIT 1"
    ),
    **{
        kind: f"SELECT w.stripe_customer_id FROM {model.__tablename__} m JOIN workspace w ON w.id = m.workspace_id "
        "WHERE m.stripe_id = $1"
        for kind, model in _MIRRORS.items()
    },
}


@dataclass(frozen=True)
class WantedSync:
    generation: int
    new: bool
    """A new generation (its slots must be reserved and its job queued), or a pending one long overdue (its job
    was lost: queue it again)."""
    calls: int
    """Stripe calls the subject's last sync made: the slots to reserve."""


@dataclass(frozen=True)
class SyncState:
    """A subject's sync as operators see it: one waits for its reservation (pending) or reads now (in flight)."""

    subject: str
    generation: int
    pending: bool
    in_flight: bool
    due_at: datetime | None
    read_began: datetime | None


@dataclass(frozen=True)
class Claim:
    read_began: datetime | None
    """When this generation's read begins (the database's clock); None: not claimed."""
    stale_in: float | None = None
    """Not claimed because an earlier run of this generation reads it: seconds until that read counts as lost."""


class BillingRepository:
    def __init__(self, db: Database) -> None:
        self.db = db

    # Syncs --------------------------------------------------------------------------------------------
    async def want_sync(self, subject: str, received_at: datetime, stale_after: float, calls: int) -> WantedSync | None:
        async with driver_connection(self.db) as connection:
            row = await connection.fetchrow(_WANT_SYNC, subject, received_at, stale_after, calls)
        return WantedSync(row["generation"], row["new"], row["calls"]) if row is not None else None

    async def want_sync_now(self, subject: str, calls: int) -> WantedSync:
        async with driver_connection(self.db) as connection:
            row = await connection.fetchrow(_WANT_SYNC_NOW, subject, calls)
        return WantedSync(row["generation"], row["new"], row["calls"])

    async def sync_due(self, subject: str, generation: int, in_seconds: float) -> None:
        """When the new generation's job is due (its reservation): a pending sync long past it has lost its job."""
        async with driver_connection(self.db) as connection:
            await connection.execute(_DUE, subject, generation, in_seconds)

    async def claim_sync(self, subject: str, generation: int, stale_after: float) -> Claim:
        async with driver_connection(self.db) as connection:
            row = await connection.fetchrow(_CLAIM_SYNC, subject, generation, stale_after)
        return Claim(row["read_began"], row["stale_in"]) if row is not None else Claim(None)

    async def release_sync(
        self, subject: str, generation: int, *, again: bool, calls: int = 1, due_in: float = 0.0
    ) -> None:
        async with driver_connection(self.db) as connection:
            await connection.execute(_RELEASE_SYNC, subject, generation, again, calls, due_in)

    async def sync_state(self, subject: str) -> SyncState | None:
        async with driver_connection(self.db) as connection:
            row = await connection.fetchrow(_SYNC_STATE, subject)
        return SyncState(**dict(row)) if row is not None else None

    @staticmethod
    async def sync_done(session: AsyncSession, subject: str, generation: int, calls: int) -> None:
        """In the sync's transaction, before its events are marked (the hand-off's lock order)."""
        await session.execute(_SYNC_DONE, {"subject": subject, "generation": generation, "calls": calls})

    async def customer_holding(self, kind: str, stripe_id: str) -> str | None:
        """The customer of a subscription or mirrored object billing holds, by its Stripe id; None: not held."""
        async with driver_connection(self.db) as connection:
            customer: str | None = await connection.fetchval(_CUSTOMER_HOLDING[kind], stripe_id)
        return customer

    # Locks, in billing's order: the sync's subject, the customer, then the rows (the workspace: identity's) ----
    @staticmethod
    async def lock_subject(session: AsyncSession, subject: str) -> None:
        """Syncs of one subject one after the other: a run claims its generation only once it holds this."""
        await session.execute(_LOCK_SUBJECT, {"subject": subject})

    @staticmethod
    async def lock_customer(session: AsyncSession, customer_id: str) -> None:
        await session.execute(_LOCK_CUSTOMER, {"customer_id": customer_id})

    @staticmethod
    async def clock(session: AsyncSession) -> datetime:
        """Now by the database's clock, the one ``received_at`` is stamped with."""
        return cast(datetime, await session.scalar(select(func.clock_timestamp())))

    # Mirrors of disputes, refunds and fraud warnings ---------------------------------------------------
    @staticmethod
    async def lock_mirror_rows(
        session: AsyncSession, kind: MirrorKind, stripe_ids: Sequence[str]
    ) -> list[tuple[StripeMirrorColumns, bool]]:
        """Each object's row, inserted empty if new, locked one by one in ascending ``stripe_id``; and whether new.

        ``ON CONFLICT DO NOTHING`` makes a concurrent first sighting wait for the
        inserting transaction, then find the row and lock it.
        """
        model = _MIRRORS[kind]
        locked = []
        for stripe_id in sorted(set(stripe_ids)):
            created = await session.scalar(
                insert(model)
                .values(stripe_id=stripe_id)
                .on_conflict_do_nothing(index_elements=["stripe_id"])
                .returning(model.id)
            )
            row = (await session.scalars(select(model).where(model.stripe_id == stripe_id).with_for_update())).one()
            locked.append((cast(StripeMirrorColumns, row), created is not None))
        return locked

    @staticmethod
    def write_mirror(
        row: StripeMirrorColumns, created: bool, obj: MirroredObject, workspace_id: int | None, read_began: datetime
    ) -> bool:
        """Write the object as read, unless a later read was written already.

        Flushed with the session, which journals what changed (the mirrors are ``Journaled``).
        """
        if not created and row.synced_at > read_began:
            return False
        row.workspace_id = workspace_id
        row.status, row.amount, row.currency, row.reason = obj.status, obj.amount, obj.currency, obj.reason
        row.stripe_created_at, row.synced_at = obj.created_at, read_began
        return True
