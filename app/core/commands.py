"""Plumbing for synchronous CLI commands that need the database and the queue.

A module's command group is a plain :func:`click.group`; :func:`mount` adds
it to Litestar's root group (a CLI plugin's ``on_cli_init``) through the root's
own ``group()``, so the group is of the root's class and each command can ask
for the ``app`` Litestar builds for the CLI, as a command added to the root
can. The composition root leaves on ``app.state.runtime`` what opens the
resources a command uses (the worker's modules: their jobs, crons and
handlers). Nothing here knows those modules.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import click

from app.core import tracing
from app.core.journal import caused_by
from app.core.module import FeatureModule
from app.core.resources import Resources
from app.core.sentry import flush_sentry
from app.core.settings import Settings

if TYPE_CHECKING:  # the worker loads this module, and no Litestar: commands get ``app`` by name
    from litestar import Litestar


__all__ = [
    "CommandRuntime",
    "command_group",
    "command_runtime",
    "mount",
    "parse_duration",
    "plural",
    "run_with_resources",
    "table",
]

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
    """``@click.group`` whose commands can take ``app: Litestar`` once :func:`mount` has added it to the CLI."""
    return click.group(name=name, help=help)


def mount(root: click.Group, group: click.Group) -> None:
    """Add ``group`` and its commands under ``root``, Litestar's root group, as a group ``root.group()`` makes.

    Litestar gives ``app`` to the commands of its root group and of groups of the root's class; click's
    ``group()`` makes a subgroup of the class its parent names (``group_class``), and that class's
    ``add_command`` gives each command ``app``. Subgroups are mounted the same way.
    """
    mounted = root.group(
        name=group.name,
        help=group.help,
        short_help=group.short_help,
        epilog=group.epilog,
        params=group.params,
        context_settings=group.context_settings,
        invoke_without_command=group.invoke_without_command,
        no_args_is_help=group.no_args_is_help,
        chain=group.chain,
        hidden=group.hidden,
    )(group.callback or _no_op)
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            mount(mounted, command)
        else:
            mounted.add_command(command, name)


def _no_op() -> None:
    """A group's own callback, for a group made without one."""


def command_runtime(app: Litestar) -> CommandRuntime:
    runtime: CommandRuntime = app.state.runtime
    return runtime


def run_with_resources(app: Litestar, work: Callable[[Resources], Awaitable[T]]) -> T:
    """Open the resources the worker uses, run ``work``, close them; Sentry and traces flushed on the way out.

    With tracing on, the command is one trace (service ``saas-jobs-cli``) named after it (``litestar webhooks
    replay``): what it queues continues it.
    """
    runtime = command_runtime(app)

    async def main() -> T:
        resources = runtime.open_for_command()
        try:
            with caused_by(_command_name()):  # the change journal's cause of what the command writes
                return await work(resources)
        finally:
            await resources.close()

    name = click.get_current_context(silent=True)
    try:
        with tracing.command_span(runtime.settings, name.command_path if name else "command"):
            return asyncio.run(main())
    finally:
        flush_sentry()


def _command_name() -> str:
    """The command as typed, from the CLI's own name on (``litestar billing reconcile``), options left out."""
    context = click.get_current_context(silent=True)
    if context is None:
        return "a command"
    return " ".join(["litestar", *context.command_path.split()[1:]])


def table(rows: Sequence[Sequence[str]]) -> str:
    """Rows in columns as wide as their widest cell (the last column as it is): what commands print."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]]) for row in rows
    )


def plural(count: int, noun: str) -> str:
    """A count and its noun, as every count is printed: ``1 webhook event``, ``2 webhook events``, ``0 events``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_duration(value: str) -> timedelta | None:
    """``90s``, ``30m``, ``2h``, ``7d`` as a command's options write a duration; None when it is not one."""
    if value[:-1].isdigit() and value[-1:] in _UNITS and len(value) < 12:
        return timedelta(**{_UNITS[value[-1]]: int(value[:-1])})
    return None
