"""Every metric the product exposes (listed in docs/operations.md), defined once, and their Prometheus exposition.

Counters and histograms live in the process that counts them: the API (its
deliveries) and each worker (processing, jobs, Stripe calls), each served at
its own ``/metrics``. Several API processes in one container (``uvicorn
--workers``) share one view through prometheus_client's multiprocess mode:
set ``PROMETHEUS_MULTIPROC_DIR`` for them (an empty directory per start).
Values read from Postgres or Redis at scrape time (inbox states, queue depth,
crons, workers alive) are added by the API's ``/metrics`` (``app.ops``).

The hot paths count through :func:`child`, which keeps each labelled child:
``labels()`` takes a lock and builds a key on every call.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "child", "exposition"]

# The text format that ``generate_latest`` writes and every Prometheus (2.x and 3.x) reads.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

disable_created_metrics()  # no ``*_created`` series beside each counter: they double what a scrape carries

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)

DELIVERIES = Counter(
    "webhook_deliveries", "Webhook deliveries received, by what became of them.", ["provider", "outcome"]
)
EVENTS_PROCESSED = Counter("webhook_events_processed", "Inbox events processed (handler committed).", ["provider"])
ATTEMPTS_FAILED = Counter("webhook_attempts_failed", "Processing attempts that failed (retried or not).", ["provider"])
EVENTS_SET_ASIDE = Counter("webhook_events_set_aside", "Inbox events set aside (one alert each).", ["provider"])
EVENTS_BACKFILLED = Counter(
    "webhook_events_backfilled",
    "Events the provider listed but the inbox lacked, stored by the backfill.",
    ["provider"],
)
PIPELINE_SECONDS = Histogram(
    "webhook_pipeline_seconds", "From an event's arrival to its processing.", ["provider"], buckets=_SECONDS
)
JOB_RUNS = Counter("job_runs", "Tries of background jobs, by outcome (ok, retry, failed).", ["job", "outcome"])
JOB_DURATION = Histogram("job_duration_seconds", "How long one try of a job ran.", ["job"], buckets=_SECONDS)
UPSTREAM_CALLS = Counter(
    "upstream_calls",
    "Calls to each upstream by outcome: ok, failed (transport error, timeout, 5xx), rejected (4xx), rate_limited "
    "(429); and calls not made: held, paused, busy (cap in flight full).",
    ["upstream", "outcome"],
)
UPSTREAM_WAIT = Histogram(
    "upstream_wait_seconds",
    "Time a call waited for its upstream's rate (and its cap in flight) before it was made.",
    ["upstream"],
    buckets=_SECONDS,
)
STRIPE_REQUESTS = Counter(
    "stripe_api_requests", "Calls to the Stripe API, by operation and HTTP status.", ["operation", "status"]
)
STRIPE_BUDGET_WAIT = Histogram(
    "stripe_api_budget_wait_seconds", "Time a Stripe call waited for a slot of the fleet's budget.", buckets=_SECONDS
)


@functools.cache
def child(metric: Any, *labels: str) -> Any:
    """The labelled child of a counter or histogram, kept: counting is then one lock-free call."""
    return metric.labels(*labels)


class _Fixed(Collector):
    def __init__(self, metrics: Iterable[Metric]) -> None:
        self.metrics = list(metrics)

    def collect(self) -> Iterator[Metric]:
        yield from self.metrics


class _Process(Collector):
    """This process's own metrics (the default registry), in a per-scrape registry."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


def exposition(extra: Iterable[Metric] = ()) -> bytes:
    """This process's metrics (all API processes', in multiprocess mode) and ``extra``, as Prometheus reads them."""
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        MultiProcessCollector(registry)
    else:
        registry.register(_Process())
    registry.register(_Fixed(extra))
    return generate_latest(registry)
