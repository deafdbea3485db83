"""``litestar worker run`` and ``python -m app.worker``: the same command."""

from __future__ import annotations

import asyncio

import click

from app.core.errors import exit_on_settings_error
from app.core.logging import configure_logging
from app.core.module import FeatureModule
from app.core.resources import Resources
from app.core.sentry import init_sentry
from app.core.settings import SettingsError, load_settings
from app.queue.cli import crons_group
from app.queue.crons import FileClock, cron_pattern
from app.queue.queues import QueueName
from app.queue.registry import JobRegistry, import_module_object
from app.worker.modules import worker_modules
from app.worker.process import WorkerProcess


def select_queues(registry: JobRegistry, option: str) -> list[str]:
    loaded = registry.queues()
    if not loaded:
        raise SettingsError("No loaded module defines a job: list the feature modules in app/worker/modules.py.")
    if not option.strip():
        return [str(queue) for queue in loaded]
    chosen: list[str] = []
    for name in (part.strip() for part in option.split(",") if part.strip()):
        if name not in {str(queue) for queue in QueueName}:
            raise SettingsError(
                f"--queues: {name!r} is not a queue: use some of {', '.join(QueueName)} (app/queue/queues.py)."
            )
        if name not in loaded:
            raise SettingsError(
                f"--queues: no loaded job uses {name!r}; the loaded modules use {', '.join(loaded)}. "
                "List the module that owns it in app/worker/modules.py."
            )
        if name not in chosen:
            chosen.append(name)
    return chosen


def run_worker(queues: str, modules: tuple[str, ...], burst: bool, fake_clock_file: str | None) -> int:
    with exit_on_settings_error():
        settings = load_settings(check_crons=True)
        configure_logging(settings)
        init_sentry(settings, "worker")
        registry = JobRegistry.from_modules(worker_modules())
        for path in modules:
            registry.add_module(import_module_object(path))
        served = select_queues(registry, queues)
        for cron in registry.crons.values():
            cron_pattern(cron, settings)
        resources = Resources.open(settings, pool_size=max(10, settings.worker_max_jobs), modules=registry.modules)
    clock = FileClock(fake_clock_file) if fake_clock_file else None

    async def main() -> int:
        try:
            process = WorkerProcess(
                resources, registry, served, all_queues=not queues.strip(), burst=burst, clock=clock
            )
            return await process.run()
        finally:
            await resources.close()

    return asyncio.run(main())


@click.command("run")
@click.option(
    "--queues", default="", help="Comma-separated queues to serve (default: every queue of the loaded modules)."
)
@click.option(
    "--module",
    "modules",
    multiple=True,
    metavar="PACKAGE.MODULE:NAME",
    help="For tests only: also load this feature module. Production lists modules in app/worker/modules.py.",
)
@click.option("--burst", is_flag=True, help="Run the jobs already due, then exit (tests and one-off drains).")
@click.option(
    "--fake-clock-file",
    default=None,
    metavar="PATH",
    help="For tests only: the cron scheduler reads the current time (ISO 8601, UTC) from this file.",
)
def run_command(queues: str, modules: tuple[str, ...], burst: bool, fake_clock_file: str | None) -> None:
    """Run the background-job worker until SIGTERM or SIGINT."""
    raise SystemExit(run_worker(queues, modules, burst, fake_clock_file))


@click.group("worker")
def worker_group() -> None:
    """The background-job worker."""


worker_group.add_command(run_command)

# Registered in app/asgi.py so the ``litestar`` CLI has ``worker`` and ``crons``.
CLI_MODULE = FeatureModule(name="queue", cli_groups=[worker_group, crons_group])
