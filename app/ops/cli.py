"""``litestar workspaces timeline ID [--limit N]``: a workspace's timeline in a terminal, as ``/ops`` shows it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from app.core.commands import command_group, run_with_resources
from app.core.resources import Resources
from app.identity.repository import JournalRow, WorkspaceSummary
from app.ops.timeline import ChangeEntry, Cursor, EventEntry, Timeline, find_workspaces, timeline
from app.webhooks.preview import shown

if TYPE_CHECKING:  # the worker loads this module, and no Litestar: commands get ``app`` by name
    from litestar import Litestar


@command_group("workspaces", help="Workspaces as operators look at them: what changed in them, and why.")
def workspaces_group() -> None:
    pass


def change_text(row: JournalRow) -> str:
    """A journal row on one line: ``workspace 42: seat_quantity 5 -> 8; member_limit 5 -> 8``."""
    columns = "; ".join(f"{column} {shown(stored)} -> {shown(new)}" for column, (stored, new) in row.changes.items())
    return f"{row.entity} {row.entity_id}: {columns}"


def _at(entry: Any) -> str:
    return f"{entry.at:%Y-%m-%d %H:%M:%S}"


def timeline_lines(found: Timeline) -> list[str]:
    """What the command prints: the workspace, each entry newest first (its changes under it), what waits."""
    workspace = found.workspace
    lines = [_heading(workspace)]
    for entry in found.entries:
        if isinstance(entry, EventEntry):
            event = entry.event
            processed = f"processed {event.processed_at:%Y-%m-%d %H:%M:%S}" if event.processed_at else event.state
            lines.append(
                f"{_at(entry)}  event {event.id}  {event.provider} {event.type}  {processed.replace('_', ' ')}"
            )
        else:
            lines.append(f"{_at(entry)}  {_source(entry)}")
        lines += [f"{row.at:%Y-%m-%d %H:%M:%S}    {change_text(row)}" for row in entry.changes]
    waiting = found.waiting
    lines += [f"Waiting: event {e.id} ({e.type}), {e.state.replace('_', ' ')}" for e in waiting.events]
    lines += [f"Waiting: {what}" for what in (waiting.stripe_read, waiting.member_limit_job) if what]
    if found.next_cursor:
        lines.append(f"Older entries: litestar workspaces timeline {workspace.id} --before {found.next_cursor}")
    count = len(found.entries)
    lines.append(f"{count} {'entry' if count == 1 else 'entries'}, newest first.")
    return lines


def _heading(workspace: WorkspaceSummary) -> str:
    keys = ", ".join(key for key in (workspace.clerk_org_id, workspace.stripe_customer_id) if key) or "no keys"
    deleted = f", deleted {workspace.deleted_at:%Y-%m-%d}" if workspace.deleted_at else ""
    plan = workspace.subscription_status or "free plan"
    return (
        f"Workspace {workspace.id} {workspace.name or ''!r} ({keys}): {plan}, {workspace.member_limit} seats{deleted}"
    )


def _source(entry: ChangeEntry) -> str:
    return f"by event {entry.event_row}" if entry.event_row is not None else f"by {entry.source}"


@workspaces_group.command(
    name="timeline",
    help="A workspace's events and what each changed, newest first (ID: its row id, Clerk organization id or "
    "Stripe customer id).",
)
@click.argument("identifier")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000), help="Entries per page.")
@click.option("--before", default=None, help="Where a page starts: the cursor the previous page printed last.")
def timeline_command(app: Litestar, identifier: str, limit: int, before: str | None) -> None:
    cursor = Cursor.parse(before)
    if before and cursor is None:
        raise click.BadParameter("not a cursor: pass the one the previous page printed.", param_hint="--before")

    async def work(resources: Resources) -> Timeline | str:
        matches = await find_workspaces(resources, identifier, by_name=False)
        if len(matches) != 1:
            return (
                f"No workspace with row id, Clerk organization id or Stripe customer id {identifier!r}."
                if not matches
                else f"{identifier!r} names {len(matches)} workspaces: give its row id."
            )
        found = await timeline(resources, matches[0].id, cursor, limit)
        return found if found is not None else f"Workspace {matches[0].id} is gone."

    found = run_with_resources(app, work)
    if isinstance(found, str):
        raise click.ClickException(found)
    for line in timeline_lines(found):
        click.echo(line)
