"""What a soak run found: every count the table shows, and each failed check with examples."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ALERT_PREFIX = "Webhook event set aside"
GAP_ALERT_PREFIX = "Webhook gap:"
HOLD_ALERT_PREFIX = "Upstream stripe is held:"


def read_alerts(path: Path) -> Counter[str]:
    """Set-aside alerts at the Sentry stub, per event id: level error, a message, no exception."""
    alerts: Counter[str] = Counter()
    if not path.exists():
        return alerts
    for line in path.read_text().splitlines():
        if ALERT_PREFIX not in line:  # most lines are failed attempts' exceptions: skip them unparsed
            continue
        record = json.loads(line)
        message = record.get("message") or ""
        if record.get("level") == "error" and message.startswith(ALERT_PREFIX) and not record.get("exceptions"):
            alerts[str(record.get("extra", {}).get("event_id"))] += 1
    return alerts


def gap_alerts(path: Path) -> int:
    """The backfill's alerts at the Sentry stub (webhooks lost upstream): one per run that stored any."""
    return _messages(path, GAP_ALERT_PREFIX)


def hold_alerts(path: Path) -> int:
    """The alerts of a Stripe hold beginning at the Sentry stub (Stripe down for everyone): one per hold."""
    return _messages(path, HOLD_ALERT_PREFIX)


def _messages(path: Path, prefix: str) -> int:
    if not path.exists():
        return 0
    return sum(
        1
        for line in path.read_text().splitlines()
        if prefix in line and (json.loads(line).get("message") or "").startswith(prefix)
    )


def ms(value: datetime | None) -> int | None:
    """A database time as the plan's unix milliseconds."""
    return None if value is None else round(value.timestamp() * 1000)


@dataclass
class Findings:
    """Everything checked; ``problems`` lists each failed check with examples."""

    sent: int = 0
    distinct: int = 0
    ignored: int = 0
    stored: int = 0
    processed: int = 0
    set_aside: int = 0
    doomed: int = 0
    missing: int = 0
    stuck: int = 0
    undelivered: int = 0
    dropped_stripe: int = 0  # events the endpoint outage dropped (outage.py)
    dropped_clerk: int = 0
    dropped_lost: int = 0  # dropped events not brought back: Stripe's not backfilled, Clerk's entity still wrong
    wrongly_set_aside: int = 0
    applied_twice: int = 0
    alerts_ok: int = 0
    drain_seconds: float | None = None
    entities_checked: int = 0
    workspaces_checked: int = 0
    mirrors_checked: int = 0
    state_mismatches: int = 0
    seat_mismatches: int = 0
    rate_limit_max: int = 0
    noisy_admitted_max: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return self.missing + self.stuck + self.undelivered + self.dropped_lost

    def problem(self, text: str, examples: list[Any] | None = None) -> None:
        shown = f" e.g. {examples[:5]}" if examples else ""
        self.problems.append(text + shown)

    def mismatch(self, what: str, key: str, got: dict[str, Any], want: dict[str, Any]) -> None:
        """One entity not in its expected end state; the first ten are listed with their differences."""
        self.state_mismatches += 1
        if self.state_mismatches <= 10:
            diff = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
            self.problems.append(f"STATE: {what} {key}: (got, expected) {diff}")
