"""``litestar identity reconcile [--dry-run]``: the pass ``IdentityReconcileCronJob`` runs, on demand."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import click

from app.core.commands import command_group, command_runtime, run_with_resources
from app.identity.reconcile import reconcile_identity

if TYPE_CHECKING:  # the worker loads this module, and no Litestar: commands get ``app`` by name
    from litestar import Litestar


@command_group("identity", help="Users, organizations and memberships, as Clerk has them.")
def identity_group() -> None:
    pass


@identity_group.command(
    name="reconcile",
    help="List everything from Clerk and apply what the webhooks missed; soft-delete the rows whose Clerk object "
    "Clerk confirms is gone (a 404 when read again), as the cron does.",
)
@click.option("--dry-run", is_flag=True, help="Only count what differs.")
def reconcile_command(app: Litestar, dry_run: bool) -> None:
    if not command_runtime(app).settings.clerk_secret_key:
        raise click.ClickException("CLERK_SECRET_KEY is not set: set the Clerk Backend API key (sk_...) to reconcile.")
    click.echo(run_with_resources(app, functools.partial(reconcile_identity, dry_run=dry_run)).summary())
