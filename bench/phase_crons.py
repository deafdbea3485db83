"""Phase 4, crons: a large inbox bulk-loaded with SQL; one recovery tick and each retention batch timed.

Both run in this process with the product's own functions (``app.webhooks.maintenance``); the recovery
queues where no worker looks (``Run.unserved``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from app.webhooks import maintenance
from app.webhooks.inbox import upkeep
from bench.measures import percentile

if TYPE_CHECKING:
    from bench.harness import Run


async def crons(run: Run) -> None:
    mode = run.mode
    await run.reset_inbox()
    payload = (
        "jsonb_build_object('type', 'user.updated', 'object', 'event', 'timestamp', 1700000000000 + g, "
        "'data', jsonb_build_object('id', 'user_' || g, 'object', 'user', 'first_name', 'Example', "
        "'last_name', 'Example', 'primary_email_address_id', 'idn_' || g, 'updated_at', 1700000000000 + g, "
        "'email_addresses', jsonb_build_array(jsonb_build_object('id', 'idn_' || g, "
        "'email_address', 'user' || g || '@example.org'))))"
    )
    started = time.perf_counter()
    # Processed rows past retention (40 days old), oldest first; pending rows stuck for an hour.
    await run.pool.execute(
        f"""
        INSERT INTO webhook_event (provider, event_id, type, payload, received_at, processed_at, attempts)
        SELECT 'clerk', 'msg_old' || g, 'user.updated', {payload},
               now() - interval '40 days' + g * interval '1 ms',
               now() - interval '40 days' + g * interval '1 ms' + interval '20 ms', 1
        FROM generate_series(1, $1::int) AS g
        """,
        mode.crons_processed,
    )
    await run.pool.execute(
        f"""
        INSERT INTO webhook_event (provider, event_id, type, payload, received_at, attempts, last_error)
        SELECT 'clerk', 'msg_stuck' || g, 'user.updated', {payload},
               now() - interval '1 hour' + g * interval '1 ms', 1, 'RuntimeError: bench'
        FROM generate_series(1, $1::int) AS g
        """,
        mode.crons_pending,
    )
    await run.pool.execute("VACUUM ANALYZE webhook_event")
    run.log(
        f"  crons: loaded {mode.crons_processed} processed + {mode.crons_pending} pending rows "
        f"in {time.perf_counter() - started:.1f} s"
    )

    # A tick with nothing due: only the candidate read on the large table.
    oldest = await run.pool.fetchval("SELECT min(received_at) FROM webhook_event WHERE processed_at IS NULL")
    idle_now = oldest + timedelta(seconds=run.resources.settings.webhook_recovery_after_seconds)
    started = time.perf_counter()
    idle = await maintenance.recover(run.unserved, now=idle_now)
    idle_ms = (time.perf_counter() - started) * 1000
    # The tick that matters: every stuck event due and not queued (e.g. after a Redis loss).
    started = time.perf_counter()
    report = await maintenance.recover(run.unserved)
    tick_ms = (time.perf_counter() - started) * 1000
    if report.requeued != mode.crons_pending or idle.requeued:
        run.notes.append(f"recovery requeued {report.requeued} of {mode.crons_pending} (idle tick: {idle.requeued})")
    await run.drop_redis_keys()

    batches: list[float] = []
    with _timed_statements(batches):
        started = time.perf_counter()
        deleted = await maintenance.delete_old_processed(run.unserved)
        total = time.perf_counter() - started
    if deleted != mode.crons_processed:
        run.notes.append(f"retention deleted {deleted} of {mode.crons_processed} rows")
    run.results.update(
        recovery_tick_ms=tick_ms,
        recovery_idle_tick_ms=idle_ms,
        recovery_requeued=report.requeued,
        retention_batch_ms_max=max(batches) * 1000,
        retention_batch_ms_p50=percentile(batches, 0.5) * 1000,
        retention_batches=len(batches),
        retention_seconds=total,
    )
    run.log(
        f"  crons: recovery tick {tick_ms:.1f} ms ({report.requeued} requeued; idle tick {idle_ms:.1f} ms), "
        f"retention {deleted} rows in {len(batches)} batches, max {max(batches) * 1000:.0f} ms, "
        f"total {total:.1f} s"
    )


@contextlib.contextmanager
def _timed_statements(durations: list[float]) -> Any:
    """Time each statement the inbox upkeep runs through ``driver_connection`` (one per retention batch)."""
    original = upkeep.driver_connection

    class Timed:
        def __init__(self, connection: Any) -> None:
            self._connection = connection

        def __getattr__(self, name: str) -> Any:
            attribute = getattr(self._connection, name)
            if name not in ("execute", "fetch", "fetchrow", "fetchval"):
                return attribute

            async def timed(*args: Any, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return await attribute(*args, **kwargs)
                finally:
                    durations.append(time.perf_counter() - started)

            return timed

    @contextlib.asynccontextmanager
    async def timed_connection(db: Any) -> AsyncIterator[Any]:
        async with original(db) as connection:
            yield Timed(connection)

    upkeep.driver_connection = timed_connection
    try:
        yield
    finally:
        upkeep.driver_connection = original
