"""Crons: UTC ticks from croniter, exactly one run per tick across workers, one catch-up after downtime."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from app.core.resources import Resources
from app.core.settings import SettingsError, load_settings
from app.queue.crons import latest_tick, next_tick
from app.queue.job import CronJob, CronTick
from app.queue.models import CronRun
from app.runtime import open_resources
from tests.queue.conftest import fetch_events, wait_for
from tests.queue.sample_jobs import EveryMinuteCronJob
from tests.stubs.sentry_ingest import SentryIngestStub

CRON_ARGS = ("--module", "tests.queue.sample_jobs:CRON_MODULE", "--fake-clock-file")


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_latest_tick_includes_a_tick_equal_to_now() -> None:
    assert latest_tick("0 8 * * 1", utc("2030-01-07 08:00:00")) == utc("2030-01-07 08:00:00")  # a Monday
    assert latest_tick("0 8 * * 1", utc("2030-01-07 07:59:59")) == utc("2029-12-31 08:00:00")
    assert latest_tick("*/10 * * * *", utc("2030-01-07 08:19:59.9")) == utc("2030-01-07 08:10:00")
    assert next_tick("0 8 * * 1", utc("2030-01-07 08:00:00")) == utc("2030-01-14 08:00:00")


@pytest.mark.parametrize("pattern", ["0 8 * * 1 0", "61 * * * *", "every monday", "* * * *"])
def test_a_bad_pattern_fails_when_the_class_is_defined(pattern: str) -> None:
    with pytest.raises(SettingsError, match=r"BadCronJob\.pattern=.* is not a valid cron pattern: use 5 fields"):
        type("BadCronJob", (CronJob,), {"pattern": pattern})


async def _runs(resources: Resources) -> list[str]:
    return [e["key"] for e in await fetch_events(resources, EveryMinuteCronJob.name())]


@pytest.mark.slow(8)
async def test_three_workers_run_each_tick_once_and_a_tick_missed_by_all_runs_once(
    events_table: Resources, start_worker: Callable[..., Any], tmp_path: Path
) -> None:
    resources = events_table
    clock = tmp_path / "clock"
    clock.write_text("2030-01-07T10:00:30+00:00")
    started = "Cron scheduler started"
    workers = await asyncio.gather(*(start_worker(*CRON_ARGS, str(clock), wait=started) for _ in range(3)))
    assert all(w.has("Cron EveryMinuteCronJob scheduled: * * * * * (UTC).") for w in workers)
    await asyncio.sleep(0.5)
    assert await _runs(resources) == []  # a cron that never ran does not fire at first start

    for minute in ("01", "02"):
        clock.write_text(f"2030-01-07T10:{minute}:05+00:00")
        slot = f"2030-01-07T10:{minute}:00+00:00"
        await wait_for(partial(_has_run, resources, slot), 10, f"the {slot} tick to run")
        await asyncio.sleep(0.5)  # every scheduler saw the tick by now
    assert await _runs(resources) == ["2030-01-07T10:01:00+00:00", "2030-01-07T10:02:00+00:00"]

    for worker in workers:
        worker.signal(signal.SIGTERM)
    codes = [await w.wait_exit(20) for w in workers]
    assert codes == [0, 0, 0], "\n".join(w.text()[-3000:] for w in workers)
    clock.write_text("2030-01-07T10:05:10+00:00")  # 10:03, 10:04 and 10:05 pass with no worker up

    await start_worker(*CRON_ARGS, str(clock), wait=started)
    await wait_for(lambda: _has_run(resources, "2030-01-07T10:05:00+00:00"), 10, "the missed tick to run")
    await asyncio.sleep(0.5)

    expected = ["2030-01-07T10:01:00+00:00", "2030-01-07T10:02:00+00:00", "2030-01-07T10:05:00+00:00"]
    assert await _runs(resources) == expected  # each tick once; of the missed ticks, only the latest
    async with resources.db.session() as session:
        rows = (await session.scalars(select(CronRun).order_by(CronRun.slot))).all()
    assert [row.slot.isoformat() for row in rows] == expected
    assert all(row.name == "EveryMinuteCronJob" and row.finished_at and row.error is None for row in rows)


async def _has_run(resources: Resources, slot: str) -> bool:
    return slot in await _runs(resources)


class FlakyCronJob(CronJob):
    pattern = "*/5 * * * *"
    fail = True

    async def handle(self, data: CronTick) -> None:
        if FlakyCronJob.fail:
            raise RuntimeError("flaky cron failed")


async def test_a_cron_records_its_failure_and_sends_sentry_check_ins(
    settings_env: dict[str, str], sentry_enabled: SentryIngestStub
) -> None:
    from app.core.sentry import init_sentry

    settings = load_settings({**settings_env, "MESSAGE_QUEUE_DRIVER": "sync", "SENTRY_DSN": sentry_enabled.dsn})
    init_sentry(settings, "worker")
    resources = open_resources(settings, ())
    slot = utc("2030-01-07 10:05:00")
    try:
        with pytest.raises(RuntimeError, match="flaky cron failed"):
            await resources.queue.add(FlakyCronJob, CronTick(slot=slot))
        FlakyCronJob.fail = False
        await resources.queue.add(FlakyCronJob, CronTick(slot=slot))  # that tick finished (failed): skipped
        await resources.queue.add(FlakyCronJob, CronTick(slot=utc("2030-01-07 10:10:00")))
        async with resources.db.session() as session:
            rows = (await session.scalars(select(CronRun).order_by(CronRun.slot))).all()
    finally:
        FlakyCronJob.fail = True
        await resources.close()

    assert [(r.slot, r.error, r.finished_at is not None) for r in rows] == [
        (slot, "RuntimeError: flaky cron failed", True),
        (utc("2030-01-07 10:10:00"), None, True),
    ]
    check_ins = sentry_enabled.wait_for(lambda items: len(items) >= 4, check_ins=True)
    assert [(c["monitor_slug"], c["status"]) for c in check_ins] == [
        ("FlakyCronJob", "in_progress"),
        ("FlakyCronJob", "error"),
        ("FlakyCronJob", "in_progress"),
        ("FlakyCronJob", "ok"),
    ]
    assert check_ins[0]["monitor_config"]["schedule"] == {"type": "crontab", "value": "*/5 * * * *"}
    errors = sentry_enabled.wait_for(lambda items: len(items) >= 1)
    assert [e["tags"]["final"] for e in errors] == ["yes"]
