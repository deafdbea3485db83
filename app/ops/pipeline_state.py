"""The pipeline's state as read at a moment: inbox counts, queue depth, workers alive, crons, upstreams.

Read at each scrape of the API's ``/metrics`` and each view of ``/ops``,
through the inbox's partial indexes and Redis' sorted sets: cheap whatever
the number of processed events.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from app.core.module import FeatureModule
from app.core.resources import Resources
from app.queue.arq_adapter import queued_count
from app.queue.crons import last_successes, latest_runs, next_tick, period_seconds
from app.queue.heartbeat import alive
from app.queue.job import CronJob
from app.queue.models import CronRun
from app.queue.queues import QueueName
from app.queue.registry import JobRegistry
from app.queue.upstreams import Upstream
from app.queue.upstreams.operations import UpstreamRow, upstream_rows
from app.webhooks.inbox import Inbox


@dataclass(frozen=True)
class CronState:
    name: str
    pattern: str
    period_seconds: float
    next_tick: datetime
    last_run: CronRun | None
    last_success: datetime | None


@dataclass
class PipelineState:
    inbox: dict[str, dict[str, int]] = field(default_factory=dict)  # pending, failed, set_aside per provider
    waiting: dict[str, int] = field(default_factory=dict)
    workers: list[str] = field(default_factory=list)
    crons: list[CronState] = field(default_factory=list)
    tenants: dict[str, tuple[int, float]] = field(default_factory=dict)
    """Per provider: tenants with unprocessed events, and the seconds since the oldest of those arrived."""
    upstreams: list[UpstreamRow] = field(default_factory=list)
    """Each upstream the workers' modules declare: its rate and its state (ok, held, paused)."""


async def read_state(
    resources: Resources,
    worker_crons: Mapping[str, type[CronJob]],
    queues: Sequence[str] = tuple(QueueName),
    upstreams: Mapping[str, Upstream] | None = None,
) -> PipelineState:
    inbox = Inbox(resources.db)
    state = PipelineState(inbox=await inbox.unprocessed_counts(), tenants=await inbox.queue_tenants())
    redis, settings = resources.redis, resources.settings
    for queue in queues:
        state.waiting[queue] = await queued_count(redis, settings, queue)
    state.workers = await alive(redis, settings)
    state.crons = await _crons(resources, worker_crons)
    state.upstreams = await upstream_rows(resources, upstreams or {})
    return state


async def _crons(resources: Resources, crons: Mapping[str, type[CronJob]]) -> list[CronState]:
    names, now = list(crons), datetime.now(UTC)
    runs, successes = await latest_runs(resources.db, names), await last_successes(resources.db, names)
    listed = []
    for name, cron in crons.items():
        pattern = cron.schedule(resources.settings)
        period = period_seconds(pattern, now)
        listed.append(CronState(name, pattern, period, next_tick(pattern, now), runs.get(name), successes.get(name)))
    return listed


def worker_crons(modules: Sequence[FeatureModule]) -> dict[str, type[CronJob]]:
    return JobRegistry.from_modules(modules).crons


class PipelineReader:
    """Reads the pipeline's state when asked (not when built: a refused scrape costs no query)."""

    def __init__(
        self,
        resources: Resources,
        crons: Mapping[str, type[CronJob]],
        queues: Sequence[str] = tuple(QueueName),
        upstreams: Mapping[str, Upstream] | None = None,
    ) -> None:
        self.resources = resources
        self.crons = dict(crons)
        self.queues = list(queues)
        """The starter's queues and the worker modules' own (``app/queue/queues.py``)."""
        self.upstreams = dict(upstreams or {})

    async def read(self) -> PipelineState:
        return await read_state(self.resources, self.crons, self.queues, self.upstreams)
