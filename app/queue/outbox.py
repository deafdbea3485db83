"""Transactional enqueue (docs/jobs.md): a job staged in a transaction is queued if and only if it commits.

``stage`` adds a ``job_outbox`` row through the caller's session, so the job
commits or rolls back with the caller's writes and survives the process dying
right after the commit. ``relay`` moves committed rows to the queue: in one
transaction it deletes a batch of rows (``FOR UPDATE SKIP LOCKED``: concurrent
relays take different rows), hands them to the queue, and commits.

- Queueing fails (Redis down): the transaction rolls back, the rows stay for
  the next round. The relay of a session's own rows after its commit does not
  raise for that (the job is safe in the outbox): it logs one warning and a
  worker's relay queues the rows once Redis answers.
- The process dies after queueing, before the commit: the rows come back and
  are queued again. Delivery is at least once. The job id, fixed when staged,
  makes the queue drop the copy while the first copy waits, runs or retries; a
  copy relayed after the first finished runs again, so a staged job must be
  idempotent, as every job already must be (a retry runs it again too).

Every worker runs :class:`OutboxRelayLoop`; the webhook pipeline also relays
the rows its handler staged right after its commit, for latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Row, Table, delete, inspect, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.dml import ReturningDelete

from app.queue.encoded import EncodedJob
from app.queue.errors import QueueUnavailableError
from app.queue.models import JobOutbox

if TYPE_CHECKING:
    from app.core.db import Database
    from app.core.resources import MessageQueue

logger = logging.getLogger(__name__)

RELAY_BATCH = 100
RELAY_INTERVAL_SECONDS = 0.5
RELAY_WARN_EVERY_SECONDS = 60.0
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
        request_id=job.request_id,
        tenant_key=job.tenant_key,
        fair=job.fair,
        trace_context=job.trace_context,
    )
    session.add(row)
    session.info.setdefault(_STAGED, []).append(row)


def staged_in(session: AsyncSession) -> list[tuple[str, Any]]:
    """The jobs ``session`` staged so far (name, data), without touching them: what a dry run reports it would
    queue before it rolls back."""
    return [(row.job_name, row.data) for row in session.info.get(_STAGED, [])]


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
    """Relay the rows ``session`` staged (after its commit), or without a session the oldest rows; how many.

    With a session, a queue that is unavailable (``QueueUnavailableError``) is
    not raised: the committed jobs are safe in ``job_outbox``, so the caller's
    work is done; one warning says so and a worker's relay queues them once
    Redis answers (0 relayed). Without, it is raised, so a relay loop can tell
    a failed round (:class:`OutboxRelayLoop` logs those, throttled).
    """
    if session is None:
        return await relay(db, send)
    ids = committed_row_ids(session)
    if not ids:
        return 0
    try:
        return await relay(db, send, ids=ids)
    except QueueUnavailableError as exc:
        logger.warning(
            "%d job(s) staged in a committed transaction wait in job_outbox: %s "
            "A worker queues them once Redis answers.",
            len(ids),
            exc,
        )
        return 0


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
        request_id=row.request_id,
        tenant_key=row.tenant_key,
        fair=row.fair,
        trace_context=row.trace_context,
    )


def _ms(at: datetime) -> int:
    return round(at.timestamp() * 1000)


class OutboxRelayLoop:
    """Every worker process runs one, so a committed staged job reaches the queue within about a second.

    That holds when the process that staged the job died right after its
    commit. A failing round (Redis or Postgres away) leaves the rows in place;
    it is logged when the trouble starts, at most once a minute while it
    lasts, and when it ends: not once per round.
    """

    def __init__(
        self,
        queue: MessageQueue,
        *,
        interval_seconds: float = RELAY_INTERVAL_SECONDS,
        warn_every_seconds: float = RELAY_WARN_EVERY_SECONDS,
    ) -> None:
        self.queue = queue
        self.interval = interval_seconds
        self.warn_every = warn_every_seconds
        self._stopped = asyncio.Event()
        self._failed_rounds = 0
        self._failing_since: float | None = None
        self._warned_at = 0.0

    def stop(self) -> None:
        self._stopped.set()

    async def run(self) -> None:
        while not self._stopped.is_set():
            if await self.relay_round() < RELAY_BATCH:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.interval):
                        await self._stopped.wait()

    async def drain(self) -> None:
        """Relay until the outbox is empty or a round fails (a burst worker, before it takes jobs)."""
        while await self.relay_round() == RELAY_BATCH:
            pass

    async def relay_round(self) -> int:
        """One batch; never raises but for cancellation."""
        try:
            relayed = await self.queue.relay_outbox()
        except Exception as exc:
            self._failed(exc)
            return 0
        if self._failing_since is not None:
            logger.info(
                "Staged jobs are relayed to the queue again, after %d failed round(s) over %.0f s.",
                self._failed_rounds,
                time.monotonic() - self._failing_since,
            )
            self._failed_rounds, self._failing_since = 0, None
        return relayed

    def _failed(self, exc: Exception) -> None:
        now = time.monotonic()
        self._failed_rounds += 1
        if self._failing_since is None:
            self._failing_since = now
        elif now - self._warned_at < self.warn_every:
            return
        self._warned_at = now
        logger.warning(
            "Staged jobs could not be relayed to the queue (%s: %s). They stay in job_outbox and are retried "
            "every %g s (%d failed round(s) so far; logged again at most every %.0f s while it lasts).",
            type(exc).__name__,
            exc,
            self.interval,
            self._failed_rounds,
            self.warn_every,
        )
