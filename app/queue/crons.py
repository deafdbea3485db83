"""Cron ticks: croniter in UTC, one durable ``cron_run`` row per tick, Sentry check-ins.

Exactly one run per tick across any number of workers: every worker's scheduler
queues the latest due tick under the job id ``cron:<Name>:<slot>`` (the queue
drops duplicates while one waits or runs), and the run itself claims the
``(name, slot)`` row: a tick already finished is skipped, and a row locked by a
live run elsewhere is left to it. A failed try records ``error``; the final one
also sets ``finished_at`` so later duplicates skip it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from croniter import croniter
from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import distinct_on, insert

from app.core.db import Database
from app.core.sentry import capture_checkin
from app.core.settings import Settings
from app.queue.job import CronJob, CronTick
from app.queue.models import CronRun

logger = logging.getLogger(__name__)
ERROR_TEXT_LIMIT = 2000


def latest_tick(pattern: str, now: datetime) -> datetime:
    """The latest tick at or before ``now`` (croniter's ``get_prev`` skips a tick equal to its start)."""
    after_this_minute = now.astimezone(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
    return croniter(pattern, after_this_minute).get_prev(datetime)


def next_tick(pattern: str, now: datetime) -> datetime:
    return croniter(pattern, now.astimezone(UTC)).get_next(datetime)


def cron_job_id(name: str, slot: datetime, *, manual: bool = False) -> str:
    """The deduplication id of one tick: every worker's scheduler queues the same one."""
    return f"cron:{name}:{'manual:' if manual else ''}{slot.astimezone(UTC).isoformat()}"


class Clock(Protocol):
    """The cron scheduler's time, and how often the scheduler reads it."""

    @property
    def read_every_seconds(self) -> float: ...

    def now(self) -> datetime: ...


class SystemClock:
    read_every_seconds = 0.5
    """A tick is queued at most half a second after it is due."""

    def now(self) -> datetime:
        return datetime.now(UTC)


async def last_slots(db: Database, names: list[str]) -> dict[str, datetime]:
    """The latest tick each cron has run (or tried), by name."""
    async with db.session() as session:
        rows = await session.execute(
            select(CronRun.name, func.max(CronRun.slot)).where(CronRun.name.in_(names)).group_by(CronRun.name)
        )
        return {name: slot for name, slot in rows.all()}


async def latest_runs(db: Database, names: list[str]) -> dict[str, CronRun]:
    """Each cron's latest tick (the row: slot, started, finished, error), by name."""
    async with db.session() as session:
        rows = await session.scalars(
            select(CronRun)
            .where(CronRun.name.in_(names))
            .order_by(CronRun.name, CronRun.slot.desc())
            .ext(distinct_on(CronRun.name))
        )
        return {row.name: row for row in rows}


async def last_successes(db: Database, names: list[str]) -> dict[str, datetime]:
    """When each cron last finished a tick without an error (durable: it outlives the workers)."""
    async with db.session() as session:
        rows = await session.execute(
            select(CronRun.name, func.max(CronRun.finished_at))
            .where(CronRun.name.in_(names), CronRun.finished_at.is_not(None), CronRun.error.is_(None))
            .group_by(CronRun.name)
        )
        return {name: finished for name, finished in rows.all() if finished is not None}


def period_seconds(pattern: str, now: datetime) -> float:
    """The time between two ticks after ``now`` (a pattern's ticks need not be evenly spaced: the next two)."""
    ticks = croniter(pattern, now.astimezone(UTC))
    first = ticks.get_next(datetime)
    return float((ticks.get_next(datetime) - first).total_seconds())


def describe_run(run: CronRun) -> str:
    tick = f"{run.slot:%Y-%m-%d %H:%M} UTC"
    if run.finished_at is None:
        return f"{tick}, running or retrying" + (f" (last error: {run.error})" if run.error else "")
    return f"{tick}, failed: {run.error}" if run.error else f"{tick}, ok"


async def last_runs(db: Database, names: list[str]) -> dict[str, str]:
    """Each cron's latest tick, described for an operator; the database's error if it cannot be read."""
    try:
        return {name: describe_run(run) for name, run in (await latest_runs(db, names)).items()}
    except Exception as exc:
        return dict.fromkeys(names, f"unknown (database: {type(exc).__name__}: {exc})")


async def run_cron_tick(
    db: Database,
    settings: Settings,
    cron_cls: type[CronJob],
    tick: CronTick,
    body: Callable[[], Awaitable[None]],
    is_final: Callable[[BaseException], bool],
) -> None:
    """Run ``body`` for one tick unless that tick already finished or runs elsewhere."""
    name = cron_cls.name()
    async with db.session() as session:
        stmt = insert(CronRun).values(name=name, slot=tick.slot).on_conflict_do_nothing()
        await session.execute(stmt)
        await session.commit()
    failure: Exception | None = None
    # The row lock, held in this session while the body runs, is the live run's
    # claim: if this process dies, Postgres drops it and the tick is free again.
    async with db.session() as lock, lock.begin():
        row = (
            await lock.execute(
                select(CronRun.id, CronRun.finished_at)
                .where(CronRun.name == name, CronRun.slot == tick.slot)
                .with_for_update(skip_locked=True)
            )
        ).first()
        if row is None:
            logger.info("Cron %s tick %s is running on another worker: skipped here.", name, tick.slot)
            return
        if row.finished_at is not None:
            logger.info("Cron %s tick %s already ran (finished %s): skipped.", name, tick.slot, row.finished_at)
            return
        checkin = _CheckIn(settings, cron_cls)
        try:
            await body()
        except Exception as exc:
            failure = exc
            final = is_final(exc)
            values: dict[str, Any] = {"error": f"{type(exc).__name__}: {exc}"[:ERROR_TEXT_LIMIT]}
            if final:
                values["finished_at"] = func.now()
            await lock.execute(update(CronRun).where(CronRun.id == row.id).values(**values))
        else:
            await lock.execute(update(CronRun).where(CronRun.id == row.id).values(finished_at=func.now(), error=None))
    checkin.finish(ok=failure is None)
    if failure is not None:
        raise failure


class _CheckIn:
    """Sentry cron check-ins (in progress, then ok or error) under the class name, when Sentry is on."""

    def __init__(self, settings: Settings, cron_cls: type[CronJob]) -> None:
        self.enabled = bool(settings.sentry_dsn)
        self.slug = cron_cls.name()
        self.started = time.monotonic()
        self.check_in_id: str | None = None
        if not self.enabled:
            return
        policy = cron_cls.retry_policy(settings)
        self.config: dict[str, Any] = {
            "schedule": {"type": "crontab", "value": cron_cls.schedule(settings)},
            "timezone": "UTC",
            "checkin_margin": 5,
            "max_runtime": max(1, math.ceil(policy.timeout_seconds / 60)),
        }
        self.check_in_id = self._send("in_progress")

    def finish(self, *, ok: bool) -> None:
        if self.enabled:
            self._send("ok" if ok else "error", duration=time.monotonic() - self.started)

    def _send(self, status: str, duration: float | None = None) -> str | None:
        return capture_checkin(
            self.slug, status, check_in_id=self.check_in_id, duration=duration, monitor_config=self.config
        )
