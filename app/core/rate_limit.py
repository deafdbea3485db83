"""A sliding-window rate limiter shared by every API process through Redis.

Each (scope, client) pair owns a sorted set that logs the admission times of
the last window (a sliding log). One Lua script trims the log, counts it and
records the new request atomically, so concurrent API processes can never
race past the limit, and it reads Redis's own clock (``TIME``) so the clocks
of the API hosts do not matter.

Why a log and not something cheaper: a fixed window lets ~2x the limit through
around a window boundary, and GCRA with a burst of ``limit`` also admits about
twice the limit within one window. The log admits at most ``limit`` requests
in *any* window-long interval, which is the intake's contract (docs/behaviour.md). Its
cost is at most ``limit`` members per key, and only admitted requests are
recorded, so a client that keeps hammering a closed window adds nothing.

The limiter fails open: when Redis is unreachable the request is admitted and
a warning is logged (throttled), because losing a webhook matters more than
briefly losing the limit. Build the Redis client you pass in with
``socket_timeout`` and ``socket_connect_timeout`` of about 0.25 s, otherwise a
hung (not refused) Redis stalls every request for the OS TCP timeout.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import RedisError

from app.core.redis import LuaScript

logger = logging.getLogger(__name__)

WARNING_INTERVAL_SECONDS = 10.0
"""At most one fail-open warning per limiter (the app builds one per process)
in this interval, so a dead Redis under load logs one line every few seconds
rather than one per request."""

# KEYS[1]: the log; ARGV: limit, window in microseconds, a request-unique suffix.
# Scores are microseconds since the epoch (~1.7e15 < 2^53, exact as a double).
# The member is built from TIME's strings, not from `now`, because Lua would
# format a large number as 1.7e+15 and collide. An entry exactly one window
# old is dropped, so any half-open window-long interval holds <= limit entries.
# When the log is full, the retry time is when enough old entries leave it
# (index count - limit, which is the oldest unless the limit was lowered).
_SLIDING_LOG_LUA = """
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local count = redis.call('ZCARD', KEYS[1])
if count < limit then
  local member = t[1] .. string.format('%06d', tonumber(t[2])) .. ':' .. ARGV[3]
  redis.call('ZADD', KEYS[1], now, member)
  redis.call('PEXPIRE', KEYS[1], math.ceil(window / 1000))
  return {1, limit - count - 1, 0}
end
local freeing = redis.call('ZRANGE', KEYS[1], count - limit, count - limit, 'WITHSCORES')
return {0, 0, tonumber(freeing[2]) + window - now}
"""


# KEYS[1]: the log; ARGV: window in microseconds. How many entries the window holds now (Redis' clock).
_COUNT_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
return redis.call('ZCOUNT', KEYS[1], now - tonumber(ARGV[1]) + 1, '+inf')
"""


@dataclass(frozen=True, slots=True)
class RateDecision:
    """The limiter's answer for one request.

    ``retry_after`` is only meaningful when denied: whole seconds (>= 1, rounded
    up) until the log has room again, ready for a ``Retry-After`` header.
    """

    allowed: bool
    remaining: int
    retry_after: int


class SlidingWindowRateLimiter:
    """Admits at most ``limit`` hits per ``window_seconds`` for each key.

    One instance per process is enough; it is safe to share across tasks. Each
    ``hit`` costs one Redis round trip (``EVALSHA``); after a Redis restart or
    ``SCRIPT FLUSH`` redis-py's script object reloads the script by itself on
    the ``NoScriptError`` (two extra round trips, once).
    """

    def __init__(
        self,
        redis: Redis,
        *,
        limit: int,
        window_seconds: int = 60,
        key_prefix: str = "",
        timeout: float | None = None,
    ) -> None:
        if limit < 1:
            raise ValueError(f"rate limit must be at least 1 per window, got {limit}")
        if window_seconds < 1:
            raise ValueError(f"rate limit window must be at least 1 s, got {window_seconds}")
        self.limit = limit
        self.window_seconds = window_seconds
        self._timeout = timeout  # each hit as a whole; None leaves it to the client's socket timeouts
        self._key_prefix = f"{key_prefix}ratelimit:"
        self._args_head = (limit, window_seconds * 1_000_000)
        self._script = LuaScript(redis, _SLIDING_LOG_LUA)
        self._count = LuaScript(redis, _COUNT_LUA)
        # Members must be unique per request even within one microsecond and
        # across processes: a random instance tag plus a local counter is
        # cheaper than a random token per hit and needs no second Redis key.
        self._member_tag = secrets.token_hex(6) + ":"
        self._member_seq = itertools.count()
        self._next_warning_at = float("-inf")
        self._suppressed = 0
        self._degraded = False

    async def used(self, scope: str, client: str) -> int:
        """How many hits ``client`` has in the current window of ``scope`` (0 when Redis cannot say: fail open)."""
        try:
            async with asyncio.timeout(self._timeout):
                return int(await self._count(keys=[f"{self._key_prefix}{scope}:{client}"], args=[self._args_head[1]]))
        except (RedisError, OSError, TimeoutError) as exc:
            self._warn_failing_open(exc)
            return 0

    async def hit(self, scope: str, client: str) -> RateDecision:
        """Record one request of ``client`` on ``scope`` if the window has room.

        Denied requests are not recorded, so a client that retries too early
        does not push its own retry time further out.
        """
        key = f"{self._key_prefix}{scope}:{client}"
        member = f"{self._member_tag}{next(self._member_seq)}"
        try:
            async with asyncio.timeout(self._timeout):
                allowed, remaining, retry_us = await self._script(keys=[key], args=[*self._args_head, member])
        except (RedisError, OSError, TimeoutError) as exc:
            self._warn_failing_open(exc)
            return RateDecision(allowed=True, remaining=self.limit, retry_after=0)
        if self._degraded:
            self._degraded = False
            logger.info("Rate limiter reached Redis again; limits are enforced again")
        if allowed:
            return RateDecision(allowed=True, remaining=int(remaining), retry_after=0)
        return RateDecision(allowed=False, remaining=0, retry_after=max(1, -(-int(retry_us) // 1_000_000)))

    def _warn_failing_open(self, exc: BaseException) -> None:
        """Log that limits are off, at most once per interval, counting the rest."""
        self._degraded = True
        now = time.monotonic()
        if now < self._next_warning_at:
            self._suppressed += 1
            return
        logger.warning(
            "Rate limiter failing open (requests are admitted unlimited): Redis call "
            "failed with %s: %s (%d failures unlogged since the previous warning); check "
            "REDIS_URL and that Redis is running",
            type(exc).__name__,
            exc,
            self._suppressed,
        )
        self._next_warning_at = now + WARNING_INTERVAL_SECONDS
        self._suppressed = 0
