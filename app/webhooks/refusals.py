"""Refused deliveries made visible: a wrong secret after a rotation shows within a minute.

Each refusal (400, 408, 413, 429) is logged at warning level with its reason,
provider and client, at most one line per provider and reason each minute; the
line counts the refusals since the previous one, so a flood costs one line a
minute and still says how big it was.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from enum import StrEnum

from app.core.metrics import DELIVERIES, child

logger = logging.getLogger(__name__)
LOG_INTERVAL_SECONDS = 60.0


class Refusal(StrEnum):
    """Why a delivery was refused; the values are the ``outcome`` label of the delivery metrics."""

    SIGNATURE = "rejected_signature"
    PAYLOAD = "rejected_payload"
    TOO_LARGE = "too_large"
    RATE_LIMITED = "rate_limited"


@dataclass
class _Tally:
    next_line_at: float = float("-inf")
    unlogged: int = 0


@dataclass
class RefusalLog:
    """One per process; safe to share between requests (no await inside)."""

    interval_seconds: float = LOG_INTERVAL_SECONDS
    _tallies: dict[tuple[str, Refusal], _Tally] = field(default_factory=dict)

    def record(self, provider: str, reason: Refusal, client: str, detail: str) -> None:
        child(DELIVERIES, provider, reason.value).inc()
        tally = self._tallies.setdefault((provider, reason), _Tally())
        now = time.monotonic()
        if now < tally.next_line_at:
            tally.unlogged += 1
            return
        logger.warning(
            "Refused a %s delivery from %s (%s): %s %d more refused for this reason since the previous line.",
            provider,
            client,
            reason.value,
            detail,
            tally.unlogged,
            extra={"provider": provider, "reason": reason.value, "client": client, "refused_unlogged": tally.unlogged},
        )
        tally.unlogged = 0
        tally.next_line_at = now + self.interval_seconds
