"""Effects that must not happen twice (an email, a message), even when a job is retried.

``perform_once(db, key, effect)`` claims ``key`` in ``side_effect_claim`` before
the effect, marks it done after, and releases the claim if the effect raises.
So a retried job skips an effect that already happened and still performs one
that failed. While the effect runs, the claimant holds a row lock: another job
finding the claim locked knows it is live and retries later.

The one gap no claim closes is a crash (SIGKILL, power loss) between the effect
and the mark: nobody knows whether the email went out. The claim is then
*abandoned*: claimed, not done, not locked. ``after_crash`` chooses:

- ``"skip"`` (default, at-most-once): the effect is not repeated; an error is
  logged naming the key, so an operator can delete the row to allow it again.
- ``"repeat"`` (at-least-once): the effect runs again; use it when a duplicate
  is harmless or the receiver deduplicates (an idempotency key).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.db import Database
from app.queue.errors import RetryLater
from app.queue.models import SideEffectClaim

logger = logging.getLogger(__name__)
BUSY_RETRY_SECONDS = 10.0
FRESH_CLAIM_SECONDS = 30.0
LOCK_NOT_AVAILABLE = "55P03"
AfterCrash = Literal["skip", "repeat"]


async def perform_once(
    db: Database, key: str, effect: Callable[[], Awaitable[object]], *, after_crash: AfterCrash = "skip"
) -> bool:
    """Run ``effect`` unless ``key`` was done already; True when it ran now."""
    async with db.session() as session:
        stmt = insert(SideEffectClaim).values(key=key).on_conflict_do_nothing().returning(SideEffectClaim.id)
        claimed_now = (await session.execute(stmt)).first() is not None
        await session.commit()
    failure: Exception | None = None
    async with db.session() as lock, lock.begin():
        claim = await _lock_claim(lock, key)
        if claim.done_at is not None:
            logger.info("Effect %s already done at %s: not repeated.", key, claim.done_at)
            return False
        if not claimed_now:
            if claim.age_seconds < FRESH_CLAIM_SECONDS:
                # Claimed a moment ago by a job that has not locked it yet: it is live.
                raise RetryLater(f"Effect {key!r} is being performed by another job", after_seconds=BUSY_RETRY_SECONDS)
            if after_crash == "skip":
                logger.error(
                    "Effect %s was claimed at %s and never confirmed: the process died during it, so it may "
                    "or may not have happened. Not repeated (at-most-once). To allow it again: "
                    "DELETE FROM side_effect_claim WHERE key = '%s'.",
                    key,
                    claim.claimed_at,
                    key,
                )
                return False
            logger.warning("Effect %s was abandoned by a crashed job: performing it again.", key)
        # A cancellation (timeout, shutdown) leaves the claim as a crash would:
        # whether the effect happened is unknown. An exception means it did not.
        try:
            await effect()
        except Exception as exc:
            failure = exc
            await lock.execute(delete(SideEffectClaim).where(SideEffectClaim.id == claim.id))
        else:
            await lock.execute(update(SideEffectClaim).where(SideEffectClaim.id == claim.id).values(done_at=func.now()))
    if failure is not None:
        raise failure
    return True


async def _lock_claim(lock: AsyncSession, key: str) -> Any:
    age = func.extract("epoch", func.now() - SideEffectClaim.claimed_at).label("age_seconds")
    stmt = (
        select(SideEffectClaim.id, SideEffectClaim.done_at, SideEffectClaim.claimed_at, age)
        .where(SideEffectClaim.key == key)
        .with_for_update(nowait=True)
    )
    try:
        row = (await lock.execute(stmt)).first()
    except DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE and "LockNotAvailable" not in repr(exc.orig):
            raise
        raise RetryLater(
            f"Effect {key!r} is being performed by another job", after_seconds=BUSY_RETRY_SECONDS
        ) from None
    if row is None:  # a failed claimant released it between our insert and our lock
        raise RetryLater(f"Effect {key!r} was just released by a failed try", after_seconds=1.0)
    return row
