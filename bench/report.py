"""The table and the closing JSON line (the rows: ``bench/rows.py``)."""

from __future__ import annotations

import json
import math
from typing import Any

from bench.rows import ROWS

REQUIRED_KEYS = (
    "intake_rps",
    "ceiling_rps",
    "intake_ratio",
    "intake_p99_ms",
    "pipeline_p50_ms",
    "pipeline_p99_ms",
    "pipeline_offered_eps",
    "drain_eps_1w",
    "drain_eps_2w",
    "noop_eps",
    "update_eps",
    "recovery_tick_ms",
    "retention_batch_ms_max",
    "adapter_arq_us",
    "adapter_single_us",
    "adapter_batch_us",
    "adapter_fair_extra_batch_us",
    "stripe_backlog_429",
    "stripe_backlog_reads_per_customer",
    "stripe_backlog_drain_ratio",
    "stripe_backlog_worker_cpu_ms",
    "stripe_backlog_cpu_ratio",
    "thin_backlog_429",
    "thin_backlog_reads_per_customer",
    "thin_backlog_reads_per_customer_unknown",
    "thin_backlog_drain_ratio",
    "thin_backlog_worker_cpu_ms",
    "outage_calls",
    "outage_set_aside",
    "outage_worker_cpu_share",
    "outage_drain_ratio",
    "isolation_probe_p99_ms",
    "isolation_flood_drain_ratio",
    "fairness_probe_p99_ms",
    "fairness_flood_before_share",
    "fairness_flood_drain_ratio",
    "metrics_intake_cost",
    "metrics_worker_cpu_cost",
    "tracing_intake_cost",
    "tracing_worker_cost",
    "journal_worker_cost",
    "timeline_p99_ms",
    "api_rss_mb",
    "worker_rss_mb",
)


def table(results: dict[str, Any], header: str) -> str:
    lines = [header, "", "| metric | value | same-run reference | target | |", "|---|--:|---|---|---|"]
    for row in ROWS:
        value = row.value(results)
        ok = None if value == "n/a" else row.ok(results)  # a phase that did not run misses nothing
        mark = "" if ok is None else ("ok" if ok else "MISS")
        lines.append(f"| {row.label} | {value} | {row.reference(results)} | {row.target} | {mark} |")
    return "\n".join(lines)


def json_line(results: dict[str, Any]) -> str:
    def clean(value: Any) -> Any:
        if isinstance(value, float):
            return None if math.isnan(value) else round(value, 3)
        return value

    ordered = {key: clean(results.get(key)) for key in REQUIRED_KEYS}
    ordered.update({key: clean(value) for key, value in results.items() if key not in ordered})
    return json.dumps(ordered, separators=(", ", ": "))
