"""``litestar billing reconcile [--all] [--dry-run]``."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import click

from app.billing.reconcile import reconcile_billing, shown
from app.core.commands import command_group, run_with_resources, table

if TYPE_CHECKING:  # the worker loads this module, and no Litestar: commands get ``app`` by name
    from litestar import Litestar


@command_group("billing", help="The workspaces' billing state, as Stripe has it.")
def billing_group() -> None:
    pass


@billing_group.command(
    name="reconcile",
    help="Read linked workspaces from Stripe again and correct what differs. A workspace that cannot be read is "
    "named and skipped; the command then exits with status 1.",
)
@click.option("--all", "every", is_flag=True, help="Every linked workspace, not only those not synced lately.")
@click.option("--dry-run", is_flag=True, help="Only report what differs.")
def reconcile_command(app: Litestar, every: bool, dry_run: bool) -> None:
    report = run_with_resources(app, functools.partial(reconcile_billing, every=every, dry_run=dry_run))
    if report.differences:
        rows = [("WORKSPACE", "COLUMN", "STORED", "STRIPE")]
        rows += [(str(d.workspace_id), d.column, shown(d.stored), shown(d.stripe)) for d in report.differences]
        click.echo(table(rows))
    for failure in report.failures:
        click.echo(failure.line())
    click.echo(report.summary())
    if report.failures:
        click.get_current_context().exit(1)
