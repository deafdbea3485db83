"""Transactional enqueue (SPEC 7): a job staged in a transaction is queued if and only if that transaction commits.

``stage`` adds a ``job_outbox`` row through the caller's session, so the job
commits or rolls back with the caller's writes and survives the process dying
right after the commit. ``relay`` moves committed rows to the queue: in one
transaction it deletes a batch of rows (``FOR UPDATE SKIP LOCKED``: concurrent
relays take different rows), hands them to the queue, and commits.

- Queueing fails (Redis down): the transaction rolls back, the rows stay for
  the next round.
- The process dies after queueing, before the commit: the rows come back and
  are queued again. Delivery is at least once. The job id, fixed when staged,
  makes the queue drop the copy while the first copy waits, runs or retries; a
  copy relayed after the first finished runs again, so a staged job must be
  idempotent, as every job already must be (a retry runs it again too).

The code that commits a session can relay what it staged at once with
``queue.relay_outbox(session=session)``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Row, Table, delete, inspect, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.dml import ReturningDelete

from app.queue.encoded import EncodedJob
from app.queue.models import JobOutbox

if TYPE_CHECKING:
    from app.core.db import Database

logger = logging.getLogger("app.queue.outbox")

RELAY_BATCH = 100
# The rows a session staged, kept on the session so the code that commits it can relay them at once.
_STAGED = "app.queue.outbox.staged"
_OUTBOX = cast(Table, JobOutbox.__table__)

Send = Callable[[list[EncodedJob]], Awaitable[None]]


def stage(session: AsyncSession, job: EncodedJob) -> None:
    """Add the job's row to the session's transaction; it is written with the session's next flush or commit."""
    row = JobOutbox(
        job_name=job.name,
        queue=job.queue,
        job_id=job.job_id,
        data=job.data,
        retry_limit=job.retry_limit,
        run_at=datetime.fromtimestamp(job.run_at_ms / 1000, UTC),
        expires_after_seconds=math.ceil(job.expires_after_ms / 1000),
    )
    session.add(row)
    session.info.setdefault(_STAGED, []).append(row)


def committed_row_ids(session: AsyncSession) -> list[int]:
    """The ids of the rows ``session`` staged and wrote, forgotten once read.

    Call after the commit. A row of a rolled-back transaction has no id any
    more, or one that matches no row: relaying it finds nothing.
    """
    rows: list[JobOutbox] = session.info.pop(_STAGED, [])
    ids = []
    for row in rows:
        identity = inspect(row).identity
        if identity is not None:
            ids.append(int(identity[0]))
    return ids


async def relay_outbox(db: Database, send: Send, *, session: AsyncSession | None = None) -> int:
    """Relay the rows ``session`` staged (after its commit), or without a session the oldest rows; how many."""
    if session is None:
        return await relay(db, send)
    ids = committed_row_ids(session)
    return await relay(db, send, ids=ids) if ids else 0


async def relay(db: Database, send: Send, *, ids: Sequence[int] | None = None, limit: int = RELAY_BATCH) -> int:
    """Delete up to ``limit`` rows (only ``ids`` if given), ``send`` them, commit; ``send`` raising keeps them."""
    async with db.session() as session:
        rows = (await session.execute(_claim(ids, limit))).all()
        if not rows:
            return 0
        await send([_encoded(row) for row in sorted(rows, key=lambda row: row.id)])
        await session.commit()
    return len(rows)


def _claim(ids: Sequence[int] | None, limit: int) -> ReturningDelete[Any]:
    oldest = select(_OUTBOX.c.id).order_by(_OUTBOX.c.id).limit(limit).with_for_update(skip_locked=True)
    if ids is not None:
        oldest = oldest.where(_OUTBOX.c.id.in_(ids))
    return delete(_OUTBOX).where(_OUTBOX.c.id.in_(oldest.scalar_subquery())).returning(*_OUTBOX.c)


def _encoded(row: Row[Any]) -> EncodedJob:
    return EncodedJob(
        name=row.job_name,
        queue=row.queue,
        job_id=row.job_id,
        data=row.data,
        retry_limit=row.retry_limit,
        run_at_ms=_ms(row.run_at),
        expires_after_ms=row.expires_after_seconds * 1000,
        enqueued_ms=_ms(row.created_at),
    )


def _ms(at: datetime) -> int:
    return round(at.timestamp() * 1000)
