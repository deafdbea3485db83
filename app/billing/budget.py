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

A caller that may give its job's slot back (a webhook's customer read,
``park_key`` naming the customer) is not kept waiting in its slot past
``PARK_AFTER_SECONDS``: its turn stays reserved under that key and it raises
``BudgetParked``, so the job comes back just before its turn (a worker starts
a job whose turn has come before older ones) and the worker's slot serves
other events meanwhile. While a backlog drains, the events that need no read,
and other providers' events, are then not stuck behind reads waiting for the
budget. Every other event of that customer that asks meanwhile parks until
just after that turn instead of reserving one of its own, and finds the read
made (``read_since``): a burst still costs one read.

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
PARK_AFTER_SECONDS = 0.5
"""A caller with a ``park_key`` waits in its job's slot this long at most; a later turn parks the job."""
PARK_MAX_SECONDS = 600.0
"""How far ahead a parked turn may be reserved (a backlog of 12,000 customer reads at 20/s)."""
PARK_EARLY_SECONDS = 0.2
"""A parked job comes back this much before its turn (the queue's poll and the job's claim take time)."""
PARK_BEHIND_SECONDS = 0.5
"""Another event of a customer whose read has a parked turn comes back this long after it: the read is made."""

# KEYS: the log of admitted and reserved calls (scores: microseconds, some in the future), the participants
# (one member per process), the pause key (set after a 429), the parked turn of the caller's key (or a key
# nobody uses). ARGV: limit, a call-unique member, this process's id, the window, how long a process counts as
# seen, the longest wait that may be reserved and the longest wait before parking (0: never park; microseconds).
# Returns {status, microseconds, processes seen}: status 1, reserved (wait that long, then call); 0, not reserved
# (paused: until the pause ends; or the first free time is too far to reserve: how far); 2, parked (a turn that
# far ahead is reserved under the key); 3, another caller with that key has a turn that far ahead. The time
# reserved: now, or the latest reserved plus the spacing (window / limit) if that is later. A parked turn is
# taken by the first caller with its key that asks at most one spacing late (so no second holds more than one
# call over the budget); past that it is gone, its slot unused.
_BUDGET_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local window = tonumber(ARGV[4])
local park_after = tonumber(ARGV[7])
redis.call('ZADD', KEYS[2], now, ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[5]))
redis.call('PEXPIRE', KEYS[2], 20000)
local seen = redis.call('ZCARD', KEYS[2])
local paused = redis.call('PTTL', KEYS[3])
if paused > 0 then
  return {0, paused * 1000, seen}
end
if park_after > 0 then
  local parked = tonumber(redis.call('GET', KEYS[4]))
  if parked and parked - now > park_after then
    return {3, parked - now, seen}
  end
  if parked then
    redis.call('DEL', KEYS[4])
    return {1, math.max(parked - now, 0), seen}
  end
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
if park_after > 0 and at - now > park_after then
  local spacing = window / tonumber(ARGV[1])
  redis.call('SET', KEYS[4], string.format('%.0f', at), 'PX', math.max(1, math.floor((at - now + spacing) / 1000)))
  return {2, at - now, seen}
end
return {1, at - now, seen}
"""


_NOT_RESERVED, _RESERVED, _PARKED, _PARKED_BEHIND = 0, 1, 2, 3


class BudgetExhaustedError(RetryLater):
    """No slot within ``MAX_WAIT_SECONDS``: the Stripe budget is saturated; the job retries a little later."""


class BudgetParked(RetryLater):
    """The caller's turn is reserved (``after_seconds`` from now, less a little): its job comes back for it.

    Not a failure, nor a warning: a fleet draining a backlog through the budget parks most of its reads.
    """

    log_level = logging.INFO
    counts_as_try = False  # a customer's events may park behind each other's turns: not tries of the job


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
        self._turn_prefix = f"{namespace}stripe:turn:"
        """Parked turns, one key per ``park_key`` (microseconds, by Redis' clock)."""
        self._script = redis.register_script(_BUDGET_LUA)
        self._process = secrets.token_hex(6)
        self._calls = itertools.count()
        self._processes_seen = 1
        self._local: _LocalShare | None = None
        self._lock = asyncio.Lock()

    async def acquire(self, park_key: str | None = None) -> float:
        """Wait for a slot; returns the seconds waited. Raises ``BudgetExhaustedError`` past the bound.

        ``park_key`` (e.g. ``customer:cus_...``): the caller's job may come back for its turn instead of
        waiting for it past ``PARK_AFTER_SECONDS``: then ``BudgetParked`` is raised, its turn kept under the key.
        """
        started = time.monotonic()
        parking = park_key is not None
        while True:
            elapsed = time.monotonic() - started
            status, wait = await self._try(PARK_MAX_SECONDS if parking else MAX_WAIT_SECONDS - elapsed, park_key)
            if status == _RESERVED:
                if wait > 0:
                    await asyncio.sleep(wait)
                return time.monotonic() - started
            if status == _PARKED:
                raise BudgetParked(
                    f"Stripe API budget ({self.per_second}/s): {park_key} has its turn in {wait:.1f} s",
                    after_seconds=max(wait - PARK_EARLY_SECONDS, 0.05),
                )
            if status == _PARKED_BEHIND:
                raise BudgetParked(
                    f"Stripe API budget ({self.per_second}/s): {park_key} is read in {wait:.1f} s",
                    after_seconds=wait + PARK_BEHIND_SECONDS,
                )
            if parking and wait > PARK_AFTER_SECONDS:  # paused after a 429, or every turn for 10 minutes taken
                raise BudgetParked(
                    f"Stripe API budget ({self.per_second}/s): no turn for {park_key} for {wait:.1f} s "
                    "(paused after a 429, or taken by a backlog)",
                    after_seconds=wait if wait <= PARK_MAX_SECONDS else wait - PARK_MAX_SECONDS,
                )
            if elapsed + wait > MAX_WAIT_SECONDS:
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

    async def _try(self, may_wait: float, park_key: str | None) -> tuple[int, float]:
        """(status, seconds): reserved (until the slot), parked (until the turn), not reserved (until one may be)."""
        try:
            status, wait_us, seen = await self._script(
                keys=[*self._keys, f"{self._turn_prefix}{park_key or ''}"],
                args=[
                    self.per_second,
                    f"{self._process}:{next(self._calls)}",
                    self._process,
                    WINDOW_US,
                    PARTICIPANT_TTL_US,
                    max(0, int(may_wait * 1_000_000)),
                    int(PARK_AFTER_SECONDS * 1_000_000) if park_key is not None else 0,
                ],
            )
        except (RedisError, OSError) as exc:
            wait = await self._local_slot(exc)
            return (_RESERVED if wait <= 0 else _NOT_RESERVED), wait
        if self._local is not None:
            self._local = None
            logger.info("Stripe API budget: Redis answers again; the fleet shares one budget again.")
        self._processes_seen = max(1, int(seen))
        if status == _NOT_RESERVED:
            return _NOT_RESERVED, max(int(wait_us), 1000) / 1_000_000
        return int(status), max(int(wait_us), 0) / 1_000_000

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
