"""``litestar upstreams list | pause NAME [--for 2h] | resume NAME``: the upstreams of the worker's modules."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from app.core.commands import command_group, command_runtime, parse_duration, plural, run_with_resources, table
from app.queue.upstreams import operations
from app.queue.upstreams.declaration import Upstream, declared_upstreams

if TYPE_CHECKING:  # the worker loads this module, and no Litestar: commands get ``app`` by name
    from litestar import Litestar


def _declared(app: Litestar) -> dict[str, Upstream]:
    return declared_upstreams(command_runtime(app).worker_modules)


def _known(app: Litestar, name: str) -> dict[str, Upstream]:
    declared = _declared(app)
    try:
        operations.find(declared, name)
    except operations.UnknownUpstream as exc:
        raise click.ClickException(str(exc)) from None
    return declared


@command_group("upstreams", help="The external APIs jobs call: their state, and pausing one.")
def upstreams_group() -> None:
    pass


@upstreams_group.command("list")
def list_command(app: Litestar) -> None:
    """Each upstream: its rate, the jobs waiting for it, and its state (ok, held since..., paused until...)."""
    declared = _declared(app)
    if not declared:
        click.echo("No upstreams: the worker's modules (app/runtime.py) declare none.")
        return
    rows = run_with_resources(app, lambda resources: operations.upstream_rows(resources, declared))
    lines = [("UPSTREAM", "RATE", "WAITING", "STATE")]
    lines += [(row.name, row.rate, plural(row.status.waiting, "job"), row.state) for row in rows]
    click.echo(table(lines))


@upstreams_group.command("pause")
@click.argument("name")
@click.option("--for", "for_", metavar="DURATION", help="End the pause by itself after this long (30m, 2h, 7d).")
def pause_command(app: Litestar, name: str, for_: str | None) -> None:
    """Stop every worker's calls to NAME within a second; its jobs wait, nothing is lost."""
    duration = parse_duration(for_) if for_ is not None else None
    if for_ is not None and (duration is None or not duration):
        raise click.BadParameter(f"{for_!r} is not a duration: give one like 30m, 2h or 7d.", param_hint="--for")
    declared = _known(app, name)
    click.echo(run_with_resources(app, lambda resources: operations.pause(resources, declared, name, duration)))


@upstreams_group.command("resume")
@click.argument("name")
def resume_command(app: Litestar, name: str) -> None:
    """Let NAME's calls go again: its waiting jobs drain at its rate."""
    declared = _known(app, name)
    click.echo(run_with_resources(app, lambda resources: operations.resume(resources, declared, name)))
