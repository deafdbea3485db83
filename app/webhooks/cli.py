"""Operator commands: ``litestar webhooks retry-abandoned | list | retry | replay | send-test``."""

from __future__ import annotations

from typing import Any

import click
from sqlalchemy import Select, or_, select, update

from app.core.commands import run_with_resources
from app.core.resources import Resources
from app.webhooks.jobs import queue_processing
from app.webhooks.maintenance import reopen_abandoned
from app.webhooks.models import WebhookEvent

STATUSES = ("pending", "failed", "abandoned", "processed")


@click.group(name="webhooks", help="Inspect and retry the webhook inbox.")
def webhooks_group() -> None:
    pass


@webhooks_group.command(name="retry-abandoned", help="Reopen every set-aside event and queue it again.")
def retry_abandoned_command() -> None:
    reopened = run_with_resources(reopen_abandoned)
    click.echo(f"Reopened {len(reopened)} webhook events.")


def _status_filter(query: Select[Any], status: str) -> Select[Any]:
    pending = WebhookEvent.processed_at.is_(None) & WebhookEvent.abandoned_at.is_(None)
    conditions = {
        "pending": pending & (WebhookEvent.attempts == 0),
        "failed": pending & (WebhookEvent.attempts > 0),
        "abandoned": WebhookEvent.abandoned_at.is_not(None),
        "processed": WebhookEvent.processed_at.is_not(None),
    }
    return query.where(conditions[status])


@webhooks_group.command(name="list", help="Show recent inbox events with their state.")
@click.option("--provider", help="Only this provider (stripe, clerk).")
@click.option("--status", type=click.Choice(STATUSES), help="Only events in this state.")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 10_000))
def list_command(provider: str | None, status: str | None, limit: int) -> None:
    async def work(resources: Resources) -> list[WebhookEvent]:
        query = select(WebhookEvent).order_by(WebhookEvent.received_at.desc(), WebhookEvent.id.desc())
        if provider:
            query = query.where(WebhookEvent.provider == provider)
        if status:
            query = _status_filter(query, status)
        async with resources.db.session() as session:
            return list((await session.scalars(query.limit(limit))).all())

    events = run_with_resources(work)
    header = f"{'ID':>8}  {'PROVIDER':<8}  {'EVENT ID':<34}  {'TYPE':<36}  {'STATUS':<9}  {'TRIES':>5}  RECEIVED"
    click.echo(header)
    for event in events:
        click.echo(
            f"{event.id:>8}  {event.provider:<8}  {event.event_id[:34]:<34}  {event.type[:36]:<36}  "
            f"{event.status:<9}  {event.attempts:>5}  {event.received_at:%Y-%m-%d %H:%M:%S}"
        )
        if event.last_error and event.processed_at is None:
            click.echo(f"{'':>10}last error: {event.last_error[:200]}")
    click.echo(f"{len(events)} event(s).")


async def _find(resources: Resources, identifier: str, provider: str | None) -> WebhookEvent:
    condition = WebhookEvent.event_id == identifier
    if identifier.isdigit():
        condition = or_(condition, WebhookEvent.id == int(identifier))
    query = select(WebhookEvent).where(condition)
    if provider:
        query = query.where(WebhookEvent.provider == provider)
    async with resources.db.session() as session:
        matches = list((await session.scalars(query)).all())
    if not matches:
        raise click.ClickException(f"No webhook event with row id or event id {identifier!r}.")
    if len(matches) > 1:
        raise click.ClickException(f"{identifier!r} matches {len(matches)} events: add --provider.")
    return matches[0]


@webhooks_group.command(name="retry", help="Queue one unprocessed event now (ID: row id or provider event id).")
@click.argument("identifier")
@click.option("--provider", help="Needed only when an event id exists for two providers.")
def retry_command(identifier: str, provider: str | None) -> None:
    async def work(resources: Resources) -> str:
        event = await _find(resources, identifier, provider)
        if event.processed_at is not None:
            raise click.ClickException(f"Event {event.event_id} is already processed: use `webhooks replay`.")
        if event.abandoned_at is not None:
            await reopen_abandoned(resources, event.id)
            return f"Reopened and queued {event.provider} event {event.event_id} (row {event.id})."
        queued = await queue_processing(resources.queue, event.id)
        state = "Queued" if queued else "Already queued:"
        return f"{state} {event.provider} event {event.event_id} (row {event.id})."

    click.echo(run_with_resources(work))


@webhooks_group.command(name="replay", help="Process a processed event again, e.g. after a handler fix.")
@click.argument("identifier")
@click.option("--provider", help="Needed only when an event id exists for two providers.")
def replay_command(identifier: str, provider: str | None) -> None:
    async def work(resources: Resources) -> str:
        event = await _find(resources, identifier, provider)
        async with resources.db.session() as session:
            await session.execute(
                update(WebhookEvent)
                .where(WebhookEvent.id == event.id)
                .values(processed_at=None, abandoned_at=None, attempts=0, last_error=None)
            )
            await session.commit()
        await queue_processing(resources.queue, event.id)
        return f"Replaying {event.provider} event {event.event_id} (row {event.id})."

    click.echo(run_with_resources(work))


@webhooks_group.command(name="send-test", help="Sign a sample event with the configured secret and post it to an API.")
@click.option("--provider", type=click.Choice(["stripe", "clerk"]), default="stripe", show_default=True)
@click.option("--url", default="http://127.0.0.1:8000", show_default=True, help="Base URL of the running API.")
def send_test_command(provider: str, url: str) -> None:
    import httpx

    from app.core.errors import exit_on_settings_error
    from app.core.settings import get_settings
    from app.testing.deliveries import (
        clerk_event,
        random_id,
        signed_clerk_delivery,
        signed_stripe_delivery,
        stripe_event,
        stripe_subscription,
    )

    with exit_on_settings_error():
        settings = get_settings()
    if provider == "stripe":
        if not settings.stripe_webhook_secrets:
            raise click.ClickException("STRIPE_WEBHOOK_SECRET is not set: `make dev` generates one.")
        event = stripe_event("customer.subscription.updated", stripe_subscription(random_id("cus")))
        delivery = signed_stripe_delivery(event, settings.stripe_webhook_secrets[0])
    else:
        if not settings.clerk_webhook_signing_secret:
            raise click.ClickException("CLERK_WEBHOOK_SIGNING_SECRET is not set: `make dev` generates one.")
        delivery = signed_clerk_delivery(clerk_event("user.created"), settings.clerk_webhook_signing_secret)
    try:
        response = httpx.post(f"{url.rstrip('/')}/webhooks/{provider}", content=delivery.body, headers=delivery.headers)
    except httpx.HTTPError as exc:
        raise click.ClickException(f"Could not reach {url} ({exc}): is the API running (`make dev`)?") from None
    click.echo(
        f"Sent {provider} {delivery.event_type} event {delivery.event_id}: HTTP {response.status_code} {response.text}"
    )
    if response.status_code != 200:
        raise SystemExit(1)
