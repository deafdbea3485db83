"""``litestar crons list`` and ``litestar crons run NAME``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

import click

from app.core.commands import command_group, command_runtime, run_with_resources, table
from app.core.resources import Resources
from app.queue.crons import cron_job_id, last_runs, next_tick
from app.queue.encoded import namespaced
from app.queue.execution import run_attempt
from app.queue.job import CronJob, CronTick, JobContext
from app.queue.registry import JobRegistry

if TYPE_CHECKING:  # the worker loads this module, and no Litestar: commands get ``app`` by name
    from litestar import Litestar


def _loaded_crons(app: Litestar) -> dict[str, type[CronJob]]:
    return JobRegistry.from_modules(command_runtime(app).worker_modules).crons


@command_group("crons", help="Scheduled jobs (crons) of the modules the worker loads.")
def crons_group() -> None:
    pass


@crons_group.command("list")
def list_command(app: Litestar) -> None:
    """Each cron: its pattern, next tick and last run."""
    crons = _loaded_crons(app)
    if not crons:
        click.echo("No crons: the worker's modules (app/runtime.py) define none.")
        return
    last = run_with_resources(app, lambda resources: last_runs(resources.db, list(crons)))
    settings, now = command_runtime(app).settings, datetime.now(UTC)
    rows = [("CRON", "PATTERN (UTC)", "NEXT TICK (UTC)", "LAST RUN")]
    for name, cron in crons.items():
        pattern = cron.schedule(settings)
        rows.append((name, pattern, f"{next_tick(pattern, now):%Y-%m-%d %H:%M}", last.get(name, "never")))
    click.echo(table(rows))


@crons_group.command("run")
@click.argument("name")
def run_command(app: Litestar, name: str) -> None:
    """Run one cron now, in this process, through the same job code as the worker."""
    crons = _loaded_crons(app)
    cron_cls = crons.get(name)
    if cron_cls is None:
        raise click.ClickException(f"No cron named {name!r}; the loaded crons are: {', '.join(crons) or 'none'}.")
    try:
        run_with_resources(app, lambda resources: run_cron_now(resources, cron_cls))
    except Exception as exc:
        raise click.ClickException(f"Cron {name} failed: {type(exc).__name__}: {exc}") from None
    click.echo(f"Cron {name} ran.")


async def run_cron_now(resources: Resources, cron_cls: type[CronJob]) -> None:
    """A manual tick: its slot is now, so it never collides with a scheduled one."""
    slot = datetime.now(UTC)
    job_id = namespaced(resources.settings, cron_job_id(cron_cls.name(), slot, manual=True))
    context = JobContext(resources, job_id, 1, 0, cron_cls.queue)
    await run_attempt(context, cron_cls, cron_cls.encode_data(CronTick(slot=slot)), may_retry=False)
