"""The one table a soak run prints, and the JSON summary the short test asserts on."""

from __future__ import annotations

from typing import TypedDict

from bench.soak.config import SoakConfig
from bench.soak.fault_record import FaultRecord
from bench.soak.findings import Findings
from bench.soak.load import Stats, percentile


class Summary(TypedDict):
    """The JSON summary: what the short test asserts on."""

    events_option: int
    sent: int
    distinct: int
    ignored_types: int
    stored: int
    processed: int
    set_aside: int
    meant_to_fail: int
    alerts_ok: int
    lost: int
    dropped: dict[str, int]
    dropped_lost: int
    applied_twice: int
    wrongly_set_aside: int
    state_mismatches: int
    seat_mismatches: int
    answers: dict[str, int]
    requests: int
    resends: int
    latency_p50_ms: float
    latency_p99_ms: float
    drain_seconds: float | None
    faults: dict[str, int]
    faults_ok: bool
    rate_limit: int
    rate_limit_max_admitted: int
    noisy_answers: dict[str, int]
    problems: list[str]


class RunResult(Summary):
    """A whole run's result: the summary, the printed table and the run's wall time."""

    table: str
    total_seconds: float


def _n(value: int) -> str:
    return f"{value:,}"


def summary(config: SoakConfig, findings: Findings, stats: Stats, faults: list[FaultRecord]) -> Summary:
    counts: dict[str, int] = {}
    for record in faults:
        counts[record.name] = counts.get(record.name, 0) + 1
    return {
        "events_option": config.events,
        "sent": findings.sent,
        "distinct": findings.distinct,
        "ignored_types": findings.ignored,
        "stored": findings.stored,
        "processed": findings.processed,
        "set_aside": findings.set_aside,
        "meant_to_fail": findings.doomed,
        "alerts_ok": findings.alerts_ok,
        "lost": findings.lost,
        "dropped": {"stripe": findings.dropped_stripe, "clerk": findings.dropped_clerk},
        "dropped_lost": findings.dropped_lost,
        "applied_twice": findings.applied_twice,
        "wrongly_set_aside": findings.wrongly_set_aside,
        "state_mismatches": findings.state_mismatches,
        "seat_mismatches": findings.seat_mismatches,
        "answers": dict(sorted(stats.answers.items())),
        "requests": stats.attempts,
        "resends": stats.resends,
        "latency_p50_ms": round(percentile(stats.latencies_ms, 0.50), 1),
        "latency_p99_ms": round(percentile(stats.latencies_ms, 0.99), 1),
        "drain_seconds": None if findings.drain_seconds is None else round(findings.drain_seconds, 1),
        "faults": counts,
        "faults_ok": all(record.ok for record in faults),
        "rate_limit": config.rate_limit,
        "rate_limit_max_admitted": findings.rate_limit_max,
        "noisy_answers": dict(stats.noisy_answers),
        "problems": findings.problems,
    }


def table(config: SoakConfig, findings: Findings, stats: Stats, faults: list[FaultRecord]) -> str:
    f = findings
    answers = " · ".join(f"{code}: {_n(n)}" for code, n in sorted(stats.answers.items()))
    fault_text = (
        "; ".join(f"{r.name} at {r.at:.0f} s ({r.note}{'' if r.ok else ' — FINDING'})" for r in faults) or "none"
    )
    drain = "did not drain" if f.drain_seconds is None else f"{f.drain_seconds:.0f} s"
    noisy = stats.noisy_answers
    rows = [
        ("sent (deliveries, incl. duplicates and the noisy client's)", _n(f.sent)),
        ("distinct events", f"{_n(f.distinct)} (+ {f.ignored} of unhandled types: 200, not stored)"),
        ("stored (inbox rows)", _n(f.stored)),
        ("processed", _n(f.processed)),
        ("set aside", f"{_n(f.set_aside)} (meant to fail: {f.doomed}; with exactly one alert: {f.alerts_ok})"),
        ("**lost**", f"**{_n(f.lost)}**"),
        (
            "dropped by the endpoint outage (never delivered)",
            f"{_n(f.dropped_stripe)} Stripe events, {_n(f.dropped_clerk)} Clerk events; not brought back by the "
            f"backfill or reconciliation: {_n(f.dropped_lost)} (counted as lost)",
        ),
        ("**applied twice**", f"**{_n(f.applied_twice)}**"),
        ("intake answers by status", answers),
        ("HTTP requests (re-sent after 503/429/errors)", f"{_n(stats.attempts)} ({_n(stats.resends)})"),
        (
            "intake latency p50 / p99",
            f"{percentile(stats.latencies_ms, 0.5):.0f} ms / {percentile(stats.latencies_ms, 0.99):.0f} ms",
        ),
        ("time to drain (after the last delivery)", drain),
        ("faults injected", fault_text),
        (
            "end state checked",
            f"{_n(f.entities_checked)} Clerk entities, {_n(f.workspaces_checked)} workspaces, "
            f"{_n(f.mirrors_checked)} Stripe mirrors: {f.state_mismatches} mismatches; "
            f"seat mismatches: {f.seat_mismatches}",
        ),
        (
            "rate limit (per client IP and route)",
            f"limit {config.rate_limit}/min; most admitted in any 60 s: "
            f"{f.rate_limit_max} (noisy client: {stats.noisy_sent} sent, "
            f"{noisy['429']} answered 429)",
        ),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"| {'measure'.ljust(width)} | value |", f"|{'-' * (width + 2)}|-------|"]
    lines += [f"| {name.ljust(width)} | {value} |" for name, value in rows]
    return "\n".join(lines)
