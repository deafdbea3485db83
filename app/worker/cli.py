"""``litestar worker run`` and ``python -m app.worker``: the same command."""

from __future__ import annotations

from collections.abc import Sequence

import click
import uvloop

from app.core import tracing
from app.core.errors import exit_on_settings_error
from app.core.logging import configure_logging
from app.core.module import FeatureModule
from app.core.sentry import init_sentry
from app.core.settings import SettingsError, get_settings
from app.queue.crons import Clock
from app.queue.registry import JobRegistry
from app.runtime import (  # the one import upward: entry points read the composition root
    WORKER_MODULES,
    all_modules,
    open_resources,
)
from app.worker.process import WorkerProcess


def select_queues(registry: JobRegistry, option: str) -> list[str]:
    loaded = registry.queues()
    if not loaded:
        raise SettingsError(
            "No loaded module defines a job: list the feature modules in app/runtime.py (WORKER_MODULES)."
        )
    if not option.strip():
        return [str(queue) for queue in loaded]
    chosen: list[str] = []
    for name in (part.strip() for part in option.split(",") if part.strip()):
        if name not in registry.known_queues():
            raise SettingsError(
                f"--queues: {name!r} is not a queue: use some of {', '.join(registry.known_queues())} (the "
                "starter's in app/queue/queues.py, a module's in its MODULE)."
            )
        if name not in loaded:
            raise SettingsError(
                f"--queues: no loaded job uses {name!r}; the loaded modules use {', '.join(loaded)}. "
                "List the module that owns it in app/runtime.py (WORKER_MODULES)."
            )
        if name not in chosen:
            chosen.append(name)
    return chosen


def run_worker(
    queues: str, burst: bool, *, extra_modules: Sequence[FeatureModule] = (), clock: Clock | None = None
) -> int:
    """The worker of ``WORKER_MODULES`` (and ``extra_modules``, which the test kit's worker entry adds).

    ``clock``: the time its cron scheduler reads, and how often (``Clock``; the system's by default).
    """
    with exit_on_settings_error():
        settings = get_settings()
        configure_logging(settings)
        init_sentry(settings, "worker")
        tracing.start(settings, "worker")
        registry = JobRegistry.from_modules([*WORKER_MODULES, *extra_modules], elsewhere=all_modules())
        served = select_queues(registry, queues)
        resources = open_resources(settings, registry.modules, pool_size=max(10, settings.worker_max_jobs))

    async def main() -> int:
        try:
            process = WorkerProcess(
                resources, registry, served, all_queues=not queues.strip(), burst=burst, clock=clock
            )
            with tracing.quiet():  # polling and relay rounds make no spans; each job's attempt does
                return await process.run()
        finally:
            await resources.close()

    try:
        return uvloop.run(main())  # the event loop uvicorn runs the API on: less CPU per socket read and write
    finally:
        tracing.shutdown()  # a stopped worker (SIGTERM) exports the spans of the jobs it finished


@click.command("run")
@click.option(
    "--queues", default="", help="Comma-separated queues to serve (default: every queue of the loaded modules)."
)
@click.option("--burst", is_flag=True, help="Run the jobs already due, then exit (one-off drains).")
def run_command(queues: str, burst: bool) -> None:
    """Run the background-job worker until SIGTERM or SIGINT."""
    raise SystemExit(run_worker(queues, burst))


@click.group("worker")
def worker_group() -> None:
    """The background-job worker."""


worker_group.add_command(run_command)
