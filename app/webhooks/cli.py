"""Operator commands: ``litestar webhooks retry-abandoned | list | retry | replay [--dry-run] | backfill``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import click

from app.core.commands import command_group, command_runtime, plural, run_with_resources
from app.core.resources import Resources
from app.webhooks import operations
from app.webhooks.backfill import backfill, event_sources, parse_since, parse_time
from app.webhooks.inbox import STATES, EventRecord, Inbox, State
from app.webhooks.operations import OperatorError, Outcome
from app.webhooks.preview import Preview, preview_replay

SHORT_ERROR_CHARS = 200
"""``webhooks list`` cuts a last error to about this many characters, at a word, unless ``--verbose``."""
# "abandoned" is what these states were called before "set_aside"; still accepted.
if TYPE_CHECKING:  # the worker loads this module, and no Litestar: commands get ``app`` by name
    from litestar import Litestar


_STATE_NAMES: dict[str, State] = {state: state for state in STATES} | {
    "abandoned": "set_aside",
    "set-aside": "set_aside",
}


@command_group("webhooks", help="Inspect and retry the webhook inbox.")
def webhooks_group() -> None:
    pass


@webhooks_group.command(name="retry-abandoned", help="Reopen every set-aside event and queue it again.")
def retry_abandoned_command(app: Litestar) -> None:
    click.echo(run_with_resources(app, operations.reopen_all))


@webhooks_group.command(name="list", help="Show recent inbox events with their state, newest first.")
@click.option("--provider", help="Only this provider (stripe, clerk).")
@click.option("--status", type=click.Choice(list(_STATE_NAMES)), help="Only events in this state.")
@click.option("--tenant", help="Only this tenant's events (a Stripe customer cus_..., a Clerk org:... or user:...).")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--verbose", "-v", is_flag=True, help="Each unprocessed event's last error whole, not cut.")
def list_command(
    app: Litestar, provider: str | None, status: str | None, tenant: str | None, limit: int, verbose: bool
) -> None:
    state = _STATE_NAMES[status] if status else None

    async def work(resources: Resources) -> list[EventRecord]:
        return await Inbox(resources.db).page(provider=provider, state=state, tenant_key=tenant, limit=limit)

    events = run_with_resources(app, work)
    click.echo(
        f"{'ID':>8}  {'PROVIDER':<8}  {'EVENT ID':<34}  {'TYPE':<36}  {'STATE':<9}  {'TRIES':>5}  {'RECEIVED':<19}"
        "  TENANT"
    )
    for event in events:
        click.echo(
            f"{event.id:>8}  {event.provider:<8}  {event.event_id[:34]:<34}  {event.type[:36]:<36}  "
            f"{event.state:<9}  {event.attempts:>5}  {event.received_at:%Y-%m-%d %H:%M:%S}  {event.tenant_key or ''}"
        )
        if event.related_object:  # a thin event: what it is about, which its sync reads
            click.echo(f"{'':>10}related object: {event.related_object}")
        if event.last_error and event.processed_at is None:
            error = event.last_error if verbose else cut_at_word(event.last_error, SHORT_ERROR_CHARS)
            click.echo(f"{'':>10}last error: " + error.replace("\n", "\n" + " " * 22))
    click.echo(f"{plural(len(events), 'event')}.")


def cut_at_word(text: str, limit: int) -> str:
    """``text`` on one line, cut before the word that would pass ``limit`` (a word longer than half of it is cut)."""
    line = " ".join(text.split())
    if len(line) <= limit:
        return line
    cut = line[:limit]
    space = cut.rfind(" ")
    return f"{cut[:space] if space > limit // 2 else cut} ... (--verbose: the whole error)"


Action = Callable[[Resources, str, str | None], Awaitable[Outcome]]


def _run(app: Litestar, action: Action, identifier: str, provider: str | None) -> None:
    async def work(resources: Resources) -> Outcome:
        return await action(resources, identifier, provider)

    try:
        click.echo(run_with_resources(app, work).message)
    except OperatorError as exc:
        raise click.ClickException(str(exc)) from None


@webhooks_group.command(name="retry", help="Queue one unprocessed event now (ID: row id or provider event id).")
@click.argument("identifier")
@click.option("--provider", help="Needed only when an event id exists for two providers.")
def retry_command(app: Litestar, identifier: str, provider: str | None) -> None:
    _run(app, operations.retry, identifier, provider)


@webhooks_group.command(name="replay", help="Process a processed event again, e.g. after a handler fix.")
@click.argument("identifier")
@click.option("--provider", help="Needed only when an event id exists for two providers.")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Run today's handler against the current Stripe or Clerk state, print what it would change, and roll it "
    "all back: nothing written, nothing queued.",
)
def replay_command(app: Litestar, identifier: str, provider: str | None, dry_run: bool) -> None:
    if not dry_run:
        _run(app, operations.replay, identifier, provider)
        return

    async def work(resources: Resources) -> Preview:
        return await preview_replay(resources, identifier, provider)

    try:
        preview = run_with_resources(app, work)
    except OperatorError as exc:
        raise click.ClickException(str(exc)) from None
    for line in preview.lines():
        click.echo(line)
    if preview.error is not None:  # the handler would fail: so would the replay
        raise SystemExit(1)


@webhooks_group.command(name="backfill", help="Store the events PROVIDER lists but the inbox never received.")
@click.argument("provider")
@click.option(
    "--since", default="72h", show_default=True, help="A duration back from now (72h, 30m, 7d) or an ISO time."
)
@click.option("--until", "until_", default=None, help="An ISO time (default: now).")
@click.option("--dry-run", is_flag=True, help="Only count what would be stored.")
def backfill_command(app: Litestar, provider: str, since: str, until_: str | None, dry_run: bool) -> None:
    now = datetime.now(UTC)
    try:
        window = (parse_since(since, now), parse_time(until_) if until_ else now)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    sources = event_sources(command_runtime(app).worker_modules)
    if provider not in sources:
        raise click.ClickException(
            f"No backfill for {provider!r}: providers with an events API: {', '.join(sources) or 'none'}."
        )

    async def work(resources: Resources) -> str:
        report = await backfill(resources, provider, sources[provider], *window, dry_run=dry_run)
        return report.summary()

    click.echo(run_with_resources(app, work))
