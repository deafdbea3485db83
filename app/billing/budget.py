"""One Stripe API budget for the whole fleet: at most ``STRIPE_API_RATE_LIMIT_PER_SECOND`` calls in any second.

Every call to Stripe, from every worker, command and cron, first takes a slot
here. The slots are a log in Redis, the same atomic approach as the webhook rate
limiter (one Lua script), with no burst allowance: calls are spaced at least
1/N s apart (N = the budget per second), so no one-second window holds more
than N, and a call that leaves its worker late cannot land in a burst that
Stripe would count in the same second. A caller reserves the first free time
(so callers are served in turn and each wakes once, instead of every waiter
polling whenever a slot frees) and waits for it, for at most
``MAX_WAIT_SECONDS`` (it holds a transaction meanwhile); a later time is not
reserved: it retries later.

A 429 from Stripe pauses the whole budget for its ``Retry-After``: every
process waits, not only the one that was told.

Redis unreachable: each process keeps to its own share of the budget (the
budget divided by the processes seen taking slots in the last ten seconds)
and says so once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.exceptions import RedisError

from app.queue.errors import RetryLater

logger = logging.getLogger(__name__)

WINDOW_US = 1_000_000
MAX_WAIT_SECONDS = 15.0
"""A caller holds a database transaction while it waits; beyond this it retries later instead."""
PARTICIPANT_TTL_US = 10_000_000

# KEYS: the log of admitted and reserved calls (scores: microseconds, some in the future), the participants
# (one member per process), the pause key (set after a 429). ARGV: limit, a call-unique member, this process's
# id, the window, how long a process counts as seen, and the longest wait that may be reserved (microseconds).
# Returns {reserved (1/0), microseconds until the reserved time (or the pause's end, or the first free time
# when it is too far to reserve), processes seen}. The time reserved: now, or the latest reserved plus the
# spacing (window / limit) if that is later.
_BUDGET_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local window = tonumber(ARGV[4])
redis.call('ZADD', KEYS[2], now, ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[5]))
redis.call('PEXPIRE', KEYS[2], 20000)
local seen = redis.call('ZCARD', KEYS[2])
local paused = redis.call('PTTL', KEYS[3])
if paused > 0 then
  return {0, paused * 1000, seen}
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local at = now
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] then
  at = math.max(now, tonumber(last[2]) + window / tonumber(ARGV[1]))
end
if at - now > tonumber(ARGV[6]) then
  return {0, at - now, seen}
end
redis.call('ZADD', KEYS[1], at, string.format('%.0f', at) .. ':' .. ARGV[2])
redis.call('PEXPIRE', KEYS[1], math.floor((at - now) / 1000) + 2000)
return {1, at - now, seen}
"""


class BudgetExhaustedError(RetryLater):
    """No slot within ``MAX_WAIT_SECONDS``: the Stripe budget is saturated; the job retries a little later."""


@dataclass
class _LocalShare:
    """This process's share of the budget while Redis is away: a sliding log in memory."""

    per_second: int
    admitted: list[float] = field(default_factory=list)

    def wait_seconds(self, now: float) -> float:
        self.admitted = [at for at in self.admitted if at > now - 1.0]
        if len(self.admitted) < self.per_second:
            self.admitted.append(now)
            return 0.0
        return self.admitted[len(self.admitted) - self.per_second] + 1.0 - now


class StripeBudget:
    """One per process; every Stripe call ``await budget.acquire()`` first."""

    def __init__(self, redis: Redis, *, per_second: int, namespace: str = "") -> None:
        self.redis = redis
        self.per_second = per_second
        self.log_key = f"{namespace}stripe:budget"
        """The calls admitted or reserved (scores: microseconds, by Redis' clock)."""
        self._keys = [self.log_key, f"{namespace}stripe:budget:processes", f"{namespace}stripe:paused"]
        self._script = redis.register_script(_BUDGET_LUA)
        self._process = secrets.token_hex(6)
        self._calls = itertools.count()
        self._processes_seen = 1
        self._local: _LocalShare | None = None
        self._lock = asyncio.Lock()

    async def acquire(self) -> float:
        """Wait for a slot; returns the seconds waited. Raises ``BudgetExhaustedError`` past the bound."""
        started = time.monotonic()
        while True:
            reserved, wait = await self._try(MAX_WAIT_SECONDS - (time.monotonic() - started))
            if reserved:
                if wait > 0:
                    await asyncio.sleep(wait)
                return time.monotonic() - started
            if time.monotonic() - started + wait > MAX_WAIT_SECONDS:
                raise BudgetExhaustedError(
                    f"The Stripe API budget ({self.per_second}/s) had no free slot within {MAX_WAIT_SECONDS:g} s: "
                    "the fleet is draining a backlog; retried shortly.",
                    after_seconds=2.0,
                )
            await asyncio.sleep(wait)

    async def paused_seconds(self) -> float:
        """How long every process still waits after a 429 (0: not paused)."""
        return max(0, int(await self.redis.pttl(self._keys[2]))) / 1000

    async def pause(self, seconds: float) -> None:
        """Stripe answered 429: no process takes a slot for ``seconds`` (best effort; never raises)."""
        try:
            await self.redis.set(self._keys[2], "1", px=max(1, int(seconds * 1000)))
        except (RedisError, OSError):
            await asyncio.sleep(seconds)

    async def _try(self, may_wait: float) -> tuple[bool, float]:
        """(True, seconds until the slot reserved), or (False, seconds until one may be: paused, or too far)."""
        try:
            reserved, wait_us, seen = await self._script(
                keys=self._keys,
                args=[
                    self.per_second,
                    f"{self._process}:{next(self._calls)}",
                    self._process,
                    WINDOW_US,
                    PARTICIPANT_TTL_US,
                    max(0, int(may_wait * 1_000_000)),
                ],
            )
        except (RedisError, OSError) as exc:
            wait = await self._local_slot(exc)
            return wait <= 0, wait
        if self._local is not None:
            self._local = None
            logger.info("Stripe API budget: Redis answers again; the fleet shares one budget again.")
        self._processes_seen = max(1, int(seen))
        if reserved:
            return True, max(int(wait_us), 0) / 1_000_000
        return False, max(int(wait_us), 1000) / 1_000_000

    async def _local_slot(self, exc: BaseException) -> float:
        if self._local is None:
            share = max(1, self.per_second // self._processes_seen)
            self._local = _LocalShare(share)
            logger.warning(
                "Stripe API budget: Redis is unavailable (%s: %s); this process keeps to its share of %d calls "
                "per second (the budget of %d shared by the %d processes seen) until Redis answers.",
                type(exc).__name__,
                exc,
                share,
                self.per_second,
                self._processes_seen,
            )
        async with self._lock:
            return self._local.wait_seconds(time.monotonic())
