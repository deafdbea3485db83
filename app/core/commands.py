"""Plumbing for synchronous CLI commands that need the database and the queue.

A command group is a :class:`LitestarGroup`, so each command can ask for the
``app`` Litestar builds for the CLI; the composition root leaves on
``app.state.runtime`` what opens the resources a command uses (the worker's
modules: their jobs, crons and handlers). Nothing here knows those modules.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

import click
from litestar import Litestar
from litestar.cli._utils import LitestarGroup

from app.core.module import FeatureModule
from app.core.resources import Resources
from app.core.sentry import flush_sentry
from app.core.settings import Settings

__all__ = ["CommandRuntime", "command_group", "command_runtime", "plural", "run_with_resources", "table"]

T = TypeVar("T")


class CommandRuntime(Protocol):
    @property
    def settings(self) -> Settings: ...
    @property
    def worker_modules(self) -> Sequence[FeatureModule]: ...

    def open_for_command(self) -> Resources:
        """Resources as the worker opens them (few connections), not yet connected."""
        ...


def command_group(name: str, help: str) -> Callable[[Callable[..., Any]], click.Group]:
    """``@click.group`` whose commands can take ``app: Litestar`` (Litestar injects it)."""
    return click.group(name=name, help=help, cls=LitestarGroup)


def command_runtime(app: Litestar) -> CommandRuntime:
    runtime: CommandRuntime = app.state.runtime
    return runtime


def run_with_resources(app: Litestar, work: Callable[[Resources], Awaitable[T]]) -> T:
    """Open the resources the worker uses, run ``work``, close them; Sentry flushed on the way out."""
    runtime = command_runtime(app)

    async def main() -> T:
        resources = runtime.open_for_command()
        try:
            return await work(resources)
        finally:
            await resources.close()

    try:
        return asyncio.run(main())
    finally:
        flush_sentry()


def table(rows: Sequence[Sequence[str]]) -> str:
    """Rows in columns as wide as their widest cell (the last column as it is): what commands print."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]]) for row in rows
    )


def plural(count: int, noun: str) -> str:
    """A count and its noun, as every count is printed: ``1 webhook event``, ``2 webhook events``, ``0 events``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
