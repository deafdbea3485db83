"""``litestar crons list`` and ``litestar crons run NAME``."""

from __future__ import annotations

from datetime import UTC, datetime

import click
from sqlalchemy import select

from app.core.commands import run_with_resources
from app.core.errors import exit_on_settings_error
from app.core.resources import Resources
from app.core.settings import get_settings
from app.queue.crons import cron_pattern, next_tick
from app.queue.execution import run_attempt
from app.queue.job import CronJob, CronTick, JobContext
from app.queue.models import CronRun
from app.queue.registry import JobRegistry


def _loaded_crons() -> dict[str, type[CronJob]]:
    from app.worker.modules import worker_modules

    return JobRegistry.from_modules(worker_modules()).crons


@click.group("crons")
def crons_group() -> None:
    """Scheduled jobs (crons) of the modules the worker loads."""


@crons_group.command("list")
def list_command() -> None:
    """Each cron: its pattern, next tick and last run."""
    with exit_on_settings_error():
        settings = get_settings()
        crons = _loaded_crons()
        patterns = {name: cron_pattern(cron, settings) for name, cron in crons.items()}
    if not crons:
        click.echo("No crons: the modules in app/worker/modules.py define none.")
        return
    last = run_with_resources(lambda resources: _last_runs(resources, list(crons)))
    now = datetime.now(UTC)
    for name, pattern in patterns.items():
        click.echo(
            f"{name}  {pattern} (UTC)  next: {next_tick(pattern, now):%Y-%m-%d %H:%M} UTC  "
            f"last run: {last.get(name, 'never')}"
        )


async def _last_runs(resources: Resources, names: list[str]) -> dict[str, str]:
    try:
        async with resources.db.session() as session:
            rows = (
                await session.execute(
                    select(CronRun)
                    .where(CronRun.name.in_(names))
                    .order_by(CronRun.name, CronRun.slot.desc())
                    .distinct(CronRun.name)
                )
            ).scalars()
            return {row.name: _describe_run(row) for row in rows}
    except Exception as exc:
        return dict.fromkeys(names, f"unknown (database: {type(exc).__name__}: {exc})")


def _describe_run(run: CronRun) -> str:
    tick = f"{run.slot:%Y-%m-%d %H:%M} UTC"
    if run.finished_at is None:
        return f"{tick}, running or retrying" + (f" (last error: {run.error})" if run.error else "")
    return f"{tick}, failed: {run.error}" if run.error else f"{tick}, ok"


@crons_group.command("run")
@click.argument("name")
def run_command(name: str) -> None:
    """Run one cron now, in this process, through the same job code as the worker."""
    with exit_on_settings_error():
        crons = _loaded_crons()
    cron_cls = crons.get(name)
    if cron_cls is None:
        raise click.ClickException(f"No cron named {name!r}; the loaded crons are: {', '.join(crons) or 'none'}.")
    try:
        run_with_resources(lambda resources: run_cron_now(resources, cron_cls))
    except Exception as exc:
        raise click.ClickException(f"Cron {name} failed: {type(exc).__name__}: {exc}") from None
    click.echo(f"Cron {name} ran.")


async def run_cron_now(resources: Resources, cron_cls: type[CronJob]) -> None:
    """A manual tick: its slot is now, so it never collides with a scheduled one."""
    slot = datetime.now(UTC)
    job_id = f"{resources.settings.redis_namespace}cron:{cron_cls.name()}:manual:{slot.isoformat()}"
    context = JobContext(resources, job_id, 1, 0, cron_cls.queue)
    await run_attempt(context, cron_cls, cron_cls.encode_data(CronTick(slot=slot)), may_retry=False)
