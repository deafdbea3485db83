"""Refused deliveries made visible: a wrong secret after a rotation shows within a minute.

Each refusal (400, 408, 413, 429) is logged at warning level with its reason,
provider and client, at most one line per provider and reason each minute; the
line counts the refusals since the previous one, so a flood costs one line a
minute and still says how big it was. It is counted in the metrics too, and
per provider, reason and minute in Redis (shared by every API process), which
the operations page sums to "refused in the last hour", and shows by reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from enum import StrEnum

from redis.asyncio import Redis
from redis.exceptions import RedisError

from app.core.metrics import DELIVERIES, child

logger = logging.getLogger(__name__)
LOG_INTERVAL_SECONDS = 60.0
COUNT_TIMEOUT_SECONDS = 2.0
"""Long enough for a busy process (a count waits for the event loop too); short enough that a hung Redis holds
few counts at once."""


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
    """One per process; safe to share between requests (no await inside: the Redis count runs beside)."""

    redis: Redis | None = None
    namespace: str = ""
    interval_seconds: float = LOG_INTERVAL_SECONDS
    _tallies: dict[tuple[str, Refusal], _Tally] = field(default_factory=dict)
    _counting: set[asyncio.Task[None]] = field(default_factory=set)

    def record(self, provider: str, reason: Refusal, client: str, detail: str) -> None:
        child(DELIVERIES, provider, reason.value).inc()
        if self.redis is not None:
            task = asyncio.get_running_loop().create_task(self._count(provider, reason))
            self._counting.add(task)
            task.add_done_callback(self._counting.discard)
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

    async def _count(self, provider: str, reason: Refusal) -> None:
        """Best effort, bounded: a refusal is never slowed or failed by Redis."""
        assert self.redis is not None
        key = minute_key(self.namespace, provider, reason, int(time.time() // 60))
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            async with asyncio.timeout(COUNT_TIMEOUT_SECONDS):
                async with self.redis.pipeline(transaction=False) as pipe:
                    pipe.incr(key)
                    pipe.expire(key, 7200)
                    await pipe.execute()


def minute_key(namespace: str, provider: str, reason: Refusal, minute: int) -> str:
    return f"{namespace}refused:{provider}:{reason.value}:{minute}"


async def refused_by_reason_last_hour(redis: Redis, namespace: str, providers: list[str]) -> dict[str, dict[str, int]]:
    """Refusals per provider and reason (``Refusal``'s values) in the last 60 minutes, every API process's."""
    now = int(time.time() // 60)
    counts: dict[str, dict[str, int]] = {}
    for provider in providers:
        counts[provider] = {}
        for reason in Refusal:
            values = await redis.mget([minute_key(namespace, provider, reason, now - back) for back in range(60)])
            counts[provider][reason.value] = sum(int(value) for value in values if value is not None)
    return counts


async def refused_last_hour(redis: Redis, namespace: str, providers: list[str]) -> dict[str, int]:
    """Refusals per provider in the last 60 minutes, every API process's."""
    by_reason = await refused_by_reason_last_hour(redis, namespace, providers)
    return {provider: sum(reasons.values()) for provider, reasons in by_reason.items()}
