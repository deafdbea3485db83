"""The rows of the bench's table: each figure, its same-run reference and its target."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Row:
    label: str
    value: Callable[[dict[str, Any]], str]
    reference: Callable[[dict[str, Any]], str]
    target: str
    ok: Callable[[dict[str, Any]], bool | None]


def _f(key: str, digits: int = 0, unit: str = "") -> Callable[[dict[str, Any]], str]:
    def show(results: dict[str, Any]) -> str:
        value = results.get(key)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "n/a"
        return f"{value:,.{digits}f}{unit}"

    return show


def _text(text: str) -> Callable[[dict[str, Any]], str]:
    return lambda _: text


def _check(predicate: Callable[[dict[str, Any]], bool]) -> Callable[[dict[str, Any]], bool | None]:
    def ok(results: dict[str, Any]) -> bool | None:
        try:
            return bool(predicate(results))
        except (KeyError, TypeError):
            return None

    return ok


def _percent(key: str) -> Callable[[dict[str, Any]], str]:
    return lambda r: f"{r[key] * 100:.1f}%" if r.get(key) is not None else "n/a"


def _ms_pair(phase: str) -> Callable[[dict[str, Any]], str]:
    return lambda r: f"{_f(f'{phase}_probe_p50_ms', 0)(r)} / {_f(f'{phase}_probe_p99_ms', 0)(r)}"


def _flood(phase: str) -> Callable[[dict[str, Any]], str]:
    return lambda r: (
        f"{_f(f'{phase}_flood_eps')(r)} events/s, alone {_f(f'{phase}_flood_alone_eps')(r)} "
        f"({_f(f'{phase}_flood_events')(r)} events)"
    )


OUTAGE_ROWS = (
    Row(
        "outage: Stripe calls while Stripe was down",
        _f("outage_calls"),
        lambda r: (
            f"{_f('outage_events')(r)} events, down {_f('outage_seconds')(r)} s, a probe every "
            f"{_f('outage_probe_seconds')(r)} s; held after {_f('outage_held_after_seconds', 1)(r)} s"
        ),
        "<= outage / probe + 3 + 2",
        _check(lambda r: r["outage_calls"] <= r["outage_calls_goal"]),
    ),
    Row(
        "outage: events set aside",
        _f("outage_set_aside"),
        _text("3 tries a round, set aside at the 3rd attempt by the recovery cron (every minute)"),
        "0",
        _check(lambda r: r["outage_set_aside"] == 0),
    ),
    Row(
        "outage: two workers' CPU while everything waited (share of a core)",
        lambda r: (
            f"{r['outage_worker_cpu_share'] * 100:.1f}%" if r.get("outage_worker_cpu_share") is not None else "n/a"
        ),
        lambda r: (
            f"beyond their idle {r['outage_idle_cpu_share'] * 100:.1f}%, once the arrivals were taken in "
            f"({_f('outage_arrival_cpu_seconds', 1)(r)} s of CPU in {_f('outage_arrival_seconds')(r)} s)"
            if r.get("outage_idle_cpu_share") is not None
            else "n/a"
        ),
        "<= 5%",
        _check(lambda r: r["outage_worker_cpu_share"] <= 0.05),
    ),
    Row(
        "outage: drain after the probe's success / (reads / 20 per s)",
        _f("outage_drain_ratio", 2),
        lambda r: f"{_f('outage_drain_reads')(r)} reads in {_f('outage_drain_seconds', 1)(r)} s",
        "<= 1.25",
        _check(lambda r: r["outage_drain_ratio"] <= 1.25),
    ),
)


FLOOD_ROWS = (
    Row(
        "isolation: Stripe events' wait p50 / p99 (ms)",
        _ms_pair("isolation"),
        lambda r: (
            f"{_f('isolation_probes')(r)} events at 5/s during a Clerk flood, max {_f('isolation_probe_max_ms')(r)}"
        ),
        "p99 < 1,000",
        _check(lambda r: r["isolation_probe_p99_ms"] < 1000),
    ),
    Row(
        "isolation: flood drain rate (with / alone)",
        _f("isolation_flood_drain_ratio", 2),
        _flood("isolation"),
        "",
        lambda r: None,
    ),
    Row(
        "fairness: other organizations' wait p50 / p99 (ms)",
        _ms_pair("fairness"),
        lambda r: (
            f"{_f('fairness_probes')(r)} events of {_f('fairness_orgs')(r)} organizations at 10/s during one's "
            f"flood, max {_f('fairness_probe_max_ms')(r)}"
        ),
        "p99 <= 1,000",
        _check(lambda r: r["fairness_probe_p99_ms"] <= 1000),
    ),
    Row(
        "fairness: flood events processed before each",
        lambda r: (
            f"{r['fairness_flood_before_share'] * 100:.2f}%"
            if r.get("fairness_flood_before_share") is not None
            else "n/a"
        ),
        lambda r: f"mean share of the flood; at most {_f('fairness_flood_before_max')(r)} events",
        "<= 2%",
        _check(lambda r: r["fairness_flood_before_share"] <= 0.02),
    ),
    Row(
        "fairness: flood drain rate (with / alone)",
        _f("fairness_flood_drain_ratio", 2),
        _flood("fairness"),
        ">= 0.9",
        _check(lambda r: r["fairness_flood_drain_ratio"] >= 0.9),
    ),
)


def _us(way: str) -> Callable[[dict[str, Any]], str]:
    return lambda r: f"{_f(f'adapter_{way}_us', 1)(r)} / {_f(f'adapter_{way}_cpu_us', 1)(r)}"


def _cost_rows(feature: str, worker: str, target: str, limit: float, drained: str) -> tuple[Row, Row]:
    """A feature's cost to the intake (req/s) and a worker (CPU per job), measured on and off in the same run:
    ``<feature>_intake_cost`` and ``<worker>_cost`` (``bench/paired.py``)."""

    def cost(key: str) -> Callable[[dict[str, Any]], str]:
        return lambda r: f"{r[key] * 100:.1f}%" if r.get(key) is not None else "n/a"

    return (
        Row(
            f"{feature}: intake cost (1 - req/s with / without)",
            cost(f"{feature}_intake_cost"),
            lambda r: (
                f"{_f(f'{feature}_intake_rps_on')(r)} req/s with, {_f(f'{feature}_intake_rps_off')(r)} without; "
                f"CPU {_f(f'{feature}_intake_cpu_us_on')(r)} / {_f(f'{feature}_intake_cpu_us_off')(r)} us per request"
            ),
            target,
            _check(lambda r: r[f"{feature}_intake_cost"] <= limit),
        ),
        Row(
            f"{feature}: worker CPU per job cost",
            cost(f"{worker}_cost"),
            lambda r: (
                f"{_f(f'{feature}_worker_cpu_ms_on', 2)(r)} ms with, {_f(f'{feature}_worker_cpu_ms_off', 2)(r)} ms "
                f"without {drained}"
            ),
            target,
            _check(lambda r: r[f"{worker}_cost"] <= limit),
        ),
    )


ADAPTER_ROWS = (
    Row(
        "arq adapter, one job a call (us per job: wall / CPU)",
        _us("single"),
        lambda r: (
            f"arq's enqueue_job {_us('arq')(r)}; Redis CPU {_f('adapter_single_redis_us', 1)(r)} / "
            f"{_f('adapter_arq_redis_us', 1)(r)}"
        ),
        "",
        lambda r: None,
    ),
    Row(
        "arq adapter, batches (us per job: wall / CPU)",
        _us("batch"),
        lambda r: f"{_f('adapter_batch')(r)} jobs a call; Redis CPU {_f('adapter_batch_redis_us', 1)(r)}",
        "",
        lambda r: None,
    ),
    Row(
        "arq adapter: fair placement's extra (us per job)",
        lambda r: f"{_f('adapter_fair_extra_single_us', 1)(r)} / {_f('adapter_fair_extra_batch_us', 1)(r)}",
        lambda r: (
            f"one a call / batches; Redis CPU {_f('adapter_fair_single_redis_us', 1)(r)} / "
            f"{_f('adapter_fair_batch_redis_us', 1)(r)} with it"
        ),
        "",
        lambda r: None,
    ),
)


ROWS = (
    Row(
        "intake, Stripe (req/s at 64 conns)",
        _f("intake_rps"),
        lambda r: f"ceiling {_f('ceiling_rps')(r)}",
        "",
        lambda r: None,
    ),
    Row(
        "intake ratio (product / ceiling)",
        _f("intake_ratio", 2),
        _text(""),
        ">= 0.90",
        _check(lambda r: r["intake_ratio"] >= 0.9),
    ),
    Row(
        "intake p50 / p99 (ms)",
        lambda r: f"{_f('intake_p50_ms', 1)(r)} / {_f('intake_p99_ms', 1)(r)}",
        lambda r: f"ceiling {_f('ceiling_p50_ms', 1)(r)} / {_f('ceiling_p99_ms', 1)(r)}",
        "",
        lambda r: None,
    ),
    Row(
        "API CPU per request (us)",
        _f("intake_cpu_us"),
        lambda r: f"ceiling {_f('ceiling_cpu_us')(r)}",
        "<= 1.1 x ceiling",
        _check(lambda r: r["intake_cpu_us"] <= 1.1 * r["ceiling_cpu_us"]),
    ),
    Row("intake, Clerk (req/s)", _f("intake_clerk_rps"), _text(""), "", lambda r: None),
    Row(
        "pipeline p50 (ms, 200 -> processed_at)",
        _f("pipeline_p50_ms", 1),
        lambda r: (
            f"{_f('pipeline_events')(r)} Clerk events at {_f('pipeline_offered_eps')(r)}/s, half of one worker's "
            f"drain just before ({_f('pipeline_reference_eps')(r)}/s)"
        ),
        "<= 50",
        _check(lambda r: r["pipeline_p50_ms"] <= 50),
    ),
    Row(
        "pipeline p99 (ms)",
        _f("pipeline_p99_ms", 1),
        lambda r: f"max {_f('pipeline_max_ms', 0)(r)}",
        "<= 100",
        _check(lambda r: r["pipeline_p99_ms"] <= 100),
    ),
    Row(
        "drain, 1 worker (Clerk events/s)",
        _f("drain_eps_1w"),
        lambda r: f"update job {_f('update_eps')(r)}, no-op {_f('noop_eps')(r)}",
        ">= 0.6 x update",
        _check(lambda r: r["drain_eps_1w"] >= 0.6 * r["update_eps"]),
    ),
    Row(
        "worker CPU per job (ms)",
        _f("drain_cpu_ms_1w", 2),
        lambda r: f"update job {_f('update_cpu_ms', 2)(r)}, no-op {_f('noop_cpu_ms', 2)(r)}",
        "",
        lambda r: None,
    ),
    Row(
        "drain, 2 workers (Clerk events/s)",
        _f("drain_eps_2w"),
        lambda r: (
            f"x{r['drain_eps_2w'] / r['drain_eps_1w']:.2f} (machine bound x{_f('drain_2w_machine_bound', 2)(r)}); "
            f"update {_f('update_eps_2w')(r)}, no-op {_f('noop_eps_2w')(r)}"
            if r.get("drain_eps_1w") and r.get("drain_eps_2w")
            else ""
        ),
        ">= 1.6 x 1 worker",
        _check(lambda r: r["drain_eps_2w"] >= 1.6 * r["drain_eps_1w"]),
    ),
    Row(
        "recovery tick (ms)",
        _f("recovery_tick_ms", 1),
        lambda r: f"{_f('recovery_requeued')(r)} requeued; idle tick {_f('recovery_idle_tick_ms', 1)(r)} ms",
        "<= 50",
        _check(lambda r: r["recovery_tick_ms"] <= 50),
    ),
    Row(
        "retention batch, max (ms)",
        _f("retention_batch_ms_max", 0),
        lambda r: f"p50 {_f('retention_batch_ms_p50', 0)(r)} ms, {_f('retention_batches')(r)} batches",
        "<= 500",
        _check(lambda r: r["retention_batch_ms_max"] <= 500),
    ),
    Row(
        "Stripe backlog: 429s from Stripe",
        _f("stripe_backlog_429"),
        lambda r: f"budget 20/s, stub limit 25/s, stub's busiest second {_f('stripe_backlog_peak_rps')(r)}",
        "0",
        _check(lambda r: r["stripe_backlog_429"] == 0),
    ),
    Row(
        "Stripe backlog: reads per customer",
        _f("stripe_backlog_reads_per_customer", 2),
        lambda r: f"{_f('stripe_backlog_events')(r)} events of {_f('stripe_backlog_customers')(r)} customers",
        "<= 1.1",
        _check(lambda r: r["stripe_backlog_reads_per_customer"] <= 1.1),
    ),
    Row(
        "Stripe backlog: drain time / (reads / 20 per s)",
        _f("stripe_backlog_drain_ratio", 2),
        lambda r: f"{_f('stripe_backlog_reads')(r)} reads in {_f('stripe_backlog_seconds', 1)(r)} s",
        "<= 1.25",
        _check(lambda r: r["stripe_backlog_drain_ratio"] <= 1.25),
    ),
    Row(
        "Stripe backlog: worker CPU per event (x a Clerk event's)",
        _f("stripe_backlog_cpu_ratio", 2),
        lambda r: (
            f"{_f('stripe_backlog_worker_cpu_ms', 2)(r)} ms (two workers, every event of the backlog); "
            f"a Clerk event {_f('stripe_backlog_clerk_cpu_ms', 2)(r)} ms (one worker's drain)"
        ),
        "<= 1.3",
        _check(lambda r: r["stripe_backlog_cpu_ratio"] <= 1.3),
    ),
    Row(
        "thin backlog: 429s from Stripe",
        _f("thin_backlog_429"),
        _text("both thin backlogs, budget 20/s, stub limit 25/s"),
        "0",
        _check(lambda r: r["thin_backlog_429"] == 0),
    ),
    Row(
        "thin backlog: reads per customer, subscriptions synced before",
        _f("thin_backlog_reads_per_customer", 2),
        lambda r: f"{_f('thin_backlog_events')(r)} thin events of {_f('thin_backlog_customers')(r)} customers",
        "<= 1.1",
        _check(lambda r: r["thin_backlog_reads_per_customer"] <= 1.1),
    ),
    Row(
        "thin backlog: reads per customer, customers never seen",
        _f("thin_backlog_reads_per_customer_unknown", 2),
        lambda r: f"as many events of {_f('thin_backlog_unknown_customers')(r)} customers",
        "<= 2.1",
        _check(lambda r: r["thin_backlog_reads_per_customer_unknown"] <= 2.1),
    ),
    Row(
        "thin backlog: drain time / (reads / 20 per s), subscriptions synced before",
        _f("thin_backlog_drain_ratio", 2),
        lambda r: f"{_f('thin_backlog_customers')(r)} customers, one read each",
        "<= 1.25",
        _check(lambda r: r["thin_backlog_drain_ratio"] <= 1.25),
    ),
    Row(
        "thin backlog: drain time / (reads / 20 per s), customers never seen",
        _f("thin_backlog_drain_ratio_unknown", 2),
        _text("few reads, a job per event: the workers' CPU can outlast the budget's time"),
        "<= 1.25",
        _check(lambda r: r["thin_backlog_drain_ratio_unknown"] <= 1.25),
    ),
    Row(
        "thin backlog: worker CPU per event / the snapshot backlog's",
        _f("thin_backlog_cpu_ratio", 2),
        lambda r: f"{_f('thin_backlog_worker_cpu_ms', 2)(r)} ms against {_f('stripe_backlog_worker_cpu_ms', 2)(r)} ms",
        "<= 1.1",
        _check(lambda r: r["thin_backlog_cpu_ratio"] <= 1.1),
    ),
    *OUTAGE_ROWS,
    *FLOOD_ROWS,
    *ADAPTER_ROWS,
    *_cost_rows("metrics", "metrics_worker_cpu", "<= 5%", 0.05, "(Clerk events, /metrics scraped every second)"),
    *_cost_rows("tracing", "tracing_worker", "<= 10%", 0.10, "(Clerk events, every span exported)"),
    Row(
        "journal: worker CPU per Clerk event, its cost",
        _percent("journal_worker_cost_clerk"),
        lambda r: (
            f"{_f('journal_clerk_cpu_ms_on', 2)(r)} ms with the journal, {_f('journal_clerk_cpu_ms_off', 2)(r)} ms "
            "without (bench/without_journal.py)"
        ),
        "<= 10%",
        _check(lambda r: r["journal_worker_cost_clerk"] <= 0.10),
    ),
    Row(
        "journal: worker CPU per Stripe backlog event, its cost",
        _percent("journal_worker_cost_stripe"),
        lambda r: (
            f"{_f('journal_stripe_cpu_ms_on', 2)(r)} ms with the journal, {_f('journal_stripe_cpu_ms_off', 2)(r)} ms "
            "without, the same backlog"
        ),
        "<= 10%",
        _check(lambda r: r["journal_worker_cost_stripe"] <= 0.10),
    ),
    Row(
        "timeline page p50 / p99 (ms)",
        lambda r: f"{_f('timeline_p50_ms', 1)(r)} / {_f('timeline_p99_ms', 1)(r)}",
        lambda r: (
            f"{_f('timeline_requests')(r)} requests; a workspace of {_f('timeline_workspace_events')(r)} events and "
            f"{_f('timeline_journal_rows')(r)} journal rows in an inbox of {_f('timeline_inbox_rows')(r)} rows"
        ),
        "p99 <= 100",
        _check(lambda r: r["timeline_p99_ms"] <= 100),
    ),
    Row("API peak RSS (MB)", _f("api_rss_mb", 0), _text(""), "<= 150", _check(lambda r: r["api_rss_mb"] <= 150)),
    Row(
        "worker peak RSS (MB)",
        _f("worker_rss_mb", 0),
        _text(""),
        "<= 150",
        _check(lambda r: r["worker_rss_mb"] <= 150),
    ),
)
