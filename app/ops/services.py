"""What the operations page reads and what its buttons do, whatever answers the request.

Reads go through the inbox repository (``Inbox``), the pipeline's state and
the refusal counters; actions go through ``webhooks.operations``, the same
code as the command line, or queue a job. Neither knows HTTP: a missing event
or cron is :class:`NotFound`, which the controller answers 404.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta

from app.core.resources import Resources
from app.identity.repository import WorkspaceSummary
from app.ops.pipeline_state import PipelineReader
from app.ops.timeline import Cursor, Timeline, find_workspaces, timeline
from app.ops.views import PAGE_SIZE, EventFilters, Overview, ProviderRow, RefusalRow, TenantRow
from app.queue.crons import cron_job_id
from app.queue.job import CronJob, CronTick
from app.queue.upstreams import Upstream
from app.queue.upstreams import operations as upstream_operations
from app.queue.upstreams.operations import UnknownUpstream
from app.webhooks import operations
from app.webhooks.crons import BackfillWindow, WebhookBackfillJob
from app.webhooks.inbox import EventRecord, Inbox
from app.webhooks.operations import OperatorError, Outcome
from app.webhooks.preview import Preview, preview_replay
from app.webhooks.refusals import refused_by_reason_last_hour

BACKFILL_HOURS = range(1, 721)
"""How far back the page's backfill may look (``webhooks backfill`` itself takes any window)."""
TOP_TENANTS = 10
MAX_ROW_ID = 2**63
"""Past a bigint no row has that id (asked of Postgres, the number would be refused, not found)."""
"""The overview lists this many tenants with the most unprocessed events."""


class NotFound(LookupError):
    """The event, cron or upstream a page or an action names does not exist."""


class OpsPages:
    """The overview, a page of events, one event, workspaces and a workspace's timeline."""

    def __init__(self, resources: Resources, inbox: Inbox, pipeline: PipelineReader, providers: Sequence[str]) -> None:
        self.resources = resources
        self.inbox = inbox
        self.pipeline = pipeline
        self.providers = sorted(providers)  # the providers the worker handles, shown even with no rows

    async def overview(self) -> Overview:
        state = await self.pipeline.read()
        latency = await self.inbox.latency_last_hour()
        processed = await self.inbox.processed_last_day()
        settings = self.resources.settings
        by_reason = await refused_by_reason_last_hour(self.resources.redis, settings.redis_namespace, self.providers)
        rows = []
        for name in sorted({*self.providers, *state.inbox, *latency, *processed}):
            counts = state.inbox.get(name, {})
            rows.append(
                ProviderRow(
                    name,
                    counts.get("pending", 0),
                    counts.get("failed", 0),
                    counts.get("set_aside", 0),
                    processed.get(name, 0),
                    sum(by_reason.get(name, {}).values()),
                    latency.get(name),
                )
            )
        tenants = [
            TenantRow(row["provider"], row["tenant_key"], int(row["n"]), row["oldest"])
            for row in await self.inbox.top_tenants(TOP_TENANTS)
        ]
        refused = {
            name: [RefusalRow(reason, count) for reason, count in reasons.items() if count]
            for name, reasons in by_reason.items()
        }
        return Overview(rows, state, tenants, {name: listed for name, listed in refused.items() if listed})

    async def events(self, filters: EventFilters, before_id: int | None) -> list[EventRecord]:
        return await self.inbox.page(
            provider=filters.provider,
            state=filters.state,
            event_type=filters.type,
            event_id=filters.event_id,
            tenant_key=filters.tenant,
            before_id=before_id,
            limit=PAGE_SIZE,
        )

    async def event(self, row_id: int) -> EventRecord:
        event = await self.inbox.get(row_id)
        if event is None:
            raise NotFound(f"No webhook event with row id {row_id}.")
        return event

    async def workspaces(self, query: str) -> list[WorkspaceSummary]:
        """By row id, Clerk organization id, Stripe customer id or a part of its name; none for no query."""
        return await find_workspaces(self.resources, query) if query.strip() else []

    async def timeline(self, workspace_id: int, cursor: Cursor | None) -> Timeline:
        found = await timeline(self.resources, workspace_id, cursor) if workspace_id < MAX_ROW_ID else None
        if found is None:
            raise NotFound(f"No workspace with row id {workspace_id}.")
        return found


class OpsActions:
    """What the buttons do; each returns the message the page shows next."""

    def __init__(
        self,
        resources: Resources,
        inbox: Inbox,
        crons: Mapping[str, type[CronJob]],
        upstreams: Mapping[str, Upstream] | None = None,
    ) -> None:
        self.resources = resources
        self.inbox = inbox
        self.crons = crons
        self.upstreams = dict(upstreams or {})

    async def retry(self, row_id: int) -> str:
        return await self._on_event(operations.retry, row_id)

    async def replay(self, row_id: int) -> str:
        return await self._on_event(operations.replay, row_id)

    async def preview(self, row_id: int) -> Preview | str:
        """What replaying the event would change, rolled back; a message when it cannot be run."""
        if row_id >= MAX_ROW_ID:
            raise NotFound(f"No webhook event with row id {row_id}.")
        try:
            return await preview_replay(self.resources, str(row_id))
        except OperatorError as exc:
            if await self.inbox.get(row_id) is None:
                raise NotFound(f"No webhook event with row id {row_id}.") from exc
            return str(exc)

    async def reopen_all(self) -> str:
        return await operations.reopen_all(self.resources)

    async def run_cron(self, name: str) -> str:
        cron = self.crons.get(name)
        if cron is None:
            raise NotFound(f"No cron named {name!r}.")
        now = datetime.now(UTC)
        await self.resources.queue.add(cron, CronTick(slot=now), deduplication_id=cron_job_id(name, now, manual=True))
        return f"Cron {name} queued: a worker runs it now."

    async def backfill(self, hours: int) -> str:
        """Stripe's events of the last ``hours`` (within ``BACKFILL_HOURS``) the inbox lacks, stored by a worker."""
        until = datetime.now(UTC)
        await self.resources.queue.add(
            WebhookBackfillJob, BackfillWindow("stripe", until - timedelta(hours=hours), until)
        )
        return f"Backfill of the last {hours} hours of Stripe events queued: a worker runs it."

    async def pause_upstream(self, name: str, duration: timedelta | None) -> str:
        """The same as ``litestar upstreams pause NAME [--for ...]``: every worker stops calling it within a second."""
        try:
            return await upstream_operations.pause(self.resources, self.upstreams, name, duration)
        except UnknownUpstream as exc:
            raise NotFound(str(exc)) from exc

    async def resume_upstream(self, name: str) -> str:
        try:
            return await upstream_operations.resume(self.resources, self.upstreams, name)
        except UnknownUpstream as exc:
            raise NotFound(str(exc)) from exc

    async def _on_event(self, action: Callable[[Resources, str], Awaitable[Outcome]], row_id: int) -> str:
        """The action's message; an event that does not exist is :class:`NotFound`, as its page would be."""
        try:
            outcome = await action(self.resources, str(row_id))
        except OperatorError as exc:
            if await self.inbox.get(row_id) is None:
                raise NotFound(f"No webhook event with row id {row_id}.") from exc
            return str(exc)
        return outcome.message
