"""``GET /metrics`` of the API: its own counters (every API process's, in multiprocess mode) and the pipeline's state.

The state is read at scrape time (``pipeline_state``) and exposed by the API
only, not by the workers: several API instances then show the same values,
which dashboards and alert rules take the ``max`` of. With ``METRICS_TOKEN``
set, a scrape must send ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Iterator
from typing import Any

from litestar import Request, Response, get
from litestar.di import NamedDependency
from litestar.exceptions import NotAuthorizedException
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from app.core.metrics import CONTENT_TYPE, exposition
from app.core.resources import Resources
from app.core.settings import Settings
from app.ops.pipeline_state import PipelineReader, PipelineState
from app.webhooks.providers import PROVIDERS

INBOX_STATES = ("pending", "failed", "set_aside")


class EnabledProviders:
    """The providers whose webhook route exists (as ``app.webhooks.module`` decides): found once per process."""

    def __init__(self, settings: Settings) -> None:
        self.names = tuple(provider.name for provider in PROVIDERS if provider.build_verifier(settings) is not None)


def state_metrics(state: PipelineState, providers: Iterable[str] = ()) -> Iterator[Metric]:
    """``providers``: each gets every inbox state's series, 0 when it has no such row (absence is not 0 to a rule)."""
    inbox = GaugeMetricFamily("webhook_inbox_events", "Inbox events by state.", labels=["provider", "state"])
    for provider in sorted({*providers, *state.inbox}):
        counts = state.inbox.get(provider, {})
        for name in INBOX_STATES:
            inbox.add_metric([provider, name], counts.get(name, 0))
    yield inbox
    tenants = GaugeMetricFamily(
        "webhook_queue_tenants", "Tenants with unprocessed events (each takes its turn).", labels=["provider"]
    )
    oldest = GaugeMetricFamily(
        "webhook_queue_oldest_seconds", "Age of the oldest unprocessed event.", labels=["provider"]
    )
    for provider in sorted({*providers, *state.tenants}):
        count, age = state.tenants.get(provider, (0, 0.0))
        tenants.add_metric([provider], count)
        oldest.add_metric([provider], age)
    yield tenants
    yield oldest
    waiting = GaugeMetricFamily("queue_jobs_waiting", "Jobs waiting in each queue (due or deferred).", labels=["queue"])
    for queue, count in state.waiting.items():
        waiting.add_metric([queue], count)
    yield waiting
    yield GaugeMetricFamily("workers_alive", "Worker processes that beat within 30 s.", value=len(state.workers))
    success = GaugeMetricFamily(
        "cron_last_success_timestamp_seconds", "When each cron last finished a tick without error.", labels=["cron"]
    )
    period = GaugeMetricFamily("cron_period_seconds", "Seconds between two ticks of each cron.", labels=["cron"])
    for cron in state.crons:
        if cron.last_success is not None:
            success.add_metric([cron.name], cron.last_success.timestamp())
        period.add_metric([cron.name], cron.period_seconds)
    yield success
    yield period
    upstreams = GaugeMetricFamily(
        "upstream_state", "Each upstream's state: 0 ok, 1 held after an outage, 2 paused.", labels=["upstream"]
    )
    for row in state.upstreams:
        upstreams.add_metric([row.name], row.status.code)
    yield upstreams


def _authorized(request: Request[Any, Any, Any], token: str | None) -> bool:
    if not token:
        return True
    given = request.headers.get("authorization", "").encode("latin-1")
    return hmac.compare_digest(given, f"Bearer {token}".encode())


@get("/metrics", include_in_schema=False, cache=False)
async def metrics(
    request: Request[Any, Any, Any],
    resources: NamedDependency[Resources],
    pipeline: NamedDependency[PipelineReader],
    enabled_providers: NamedDependency[EnabledProviders],
) -> Response[bytes]:
    """Prometheus' text format."""
    if not _authorized(request, resources.settings.metrics_token):
        raise NotAuthorizedException(
            detail="Send Authorization: Bearer <METRICS_TOKEN>.", headers={"WWW-Authenticate": "Bearer"}
        )
    body = exposition(state_metrics(await pipeline.read(), enabled_providers.names))
    # Litestar adds the charset itself to a text/* media type.
    return Response(body, media_type=CONTENT_TYPE.removesuffix("; charset=utf-8"))
