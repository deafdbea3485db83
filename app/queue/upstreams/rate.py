"""An upstream's rate: one budget for the whole fleet, at most N calls in any second (N: its declaration's).

Every call to an upstream, from every worker, command and cron, first takes a
slot here (``UpstreamCalls.call`` does; Stripe's N is
``STRIPE_API_RATE_LIMIT_PER_SECOND``). The slots are a log in Redis, the same
atomic approach as the webhook rate limiter (one Lua script), with no burst
allowance: calls are spaced at least 1/N s apart, so no one-second window
holds more than N, and a call that leaves its worker late cannot land in a
burst that the upstream would count in the same second.

Two ways to take slots:

- :meth:`RateBudget.acquire`: one call now, waiting for the first free slot
  (callers are served in order: each reserves the first free time and wakes
  once), for at most ``MAX_WAIT_SECONDS``; a later one is not reserved.
  Commands and crons use it.
- A *reservation* (:meth:`reserve`, :meth:`take`): the slots of one sync's
  calls (``calls`` slots, one spacing apart), reserved under the sync's
  subject when the sync is asked for, so that its job is queued for the time
  its reservation comes and waits for nothing meanwhile: no worker slot, no
  transaction, no lock. A reservation is taken by the first caller of its
  subject that comes at most one spacing late; past that it is gone, its
  slots unused, and a new one is made. Stripe's syncs use them
  (``app/billing/sync.py``). (A *turn* is another thing: a tenant's place in a
  fair queue, ``app/queue/fairness.py``.)

Reservations and slots schedule the calls; the guarantee is kept at the
moment of each call (:meth:`RateBudget.admit`): the calls actually made are
logged too, and one that would be the N+1th in a second waits its moment. A
sync that took its reservation and then waited for its locks (a busy
database) would otherwise call late, beside the calls of the reservations
after its own.

A 429 pauses the whole budget for its ``Retry-After`` (:meth:`RateBudget.pause`):
every process waits, not only the one that was told. (An operator's pause of
the upstream, and a hold after an outage, are the gate's: ``gate.py``.)

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

from app.core.redis import LuaScript
from app.queue.errors import RetryLater
from app.queue.upstreams.scripts import ADMIT_LUA, BUDGET_LUA

logger = logging.getLogger(__name__)

WINDOW_US = 1_000_000
MAX_WAIT_SECONDS = 15.0
"""How long :meth:`RateBudget.acquire` waits for a slot at most; beyond, the caller retries later."""
PARTICIPANT_TTL_US = 10_000_000
TAKE_WITHIN_SECONDS = 0.5
"""A sync whose reservation is this close waits for it where it is; a later one sends its job away until then."""
RESERVATION_EARLY_SECONDS = 0.2
"""A sync's job is queued this much before its reservation (the queue's poll and the job's start take time)."""

ADMIT_WAIT_SECONDS = 2.0
"""A call waits at most this long at the moment it is made; a sync holding its locks then comes back later."""

_NOT_RESERVED, _RESERVED, _RESERVATION_MADE, _RESERVATION_AHEAD = 0, 1, 2, 3


class BudgetExhaustedError(RetryLater):
    """No slot within ``MAX_WAIT_SECONDS``: the budget is saturated; the job comes back a little later.

    A wait, not a failure: the try is given back.
    """

    spends_attempt = False


class SlotLater(RetryLater):
    """The caller's slot of the budget is ``after_seconds`` away (a sync's reservation: less a little): its job comes
    back for it.

    Not a failure, nor a warning: a fleet draining a backlog defers most of its syncs once. The try is given back.
    """

    log_level = logging.INFO
    spends_attempt = False


class BudgetShortfall(Exception):
    """A reservation's holder needed more calls than it held and the next free slot is not near: it reserves again."""

    def __init__(self, calls_made: int) -> None:
        super().__init__(f"a sync needed more than the {calls_made} call(s) its reservation held")
        self.calls_made = calls_made


@dataclass
class Reservation:
    """A sync's reserved slots: ``calls`` calls, the first at ``first`` (monotonic), each next one spacing later."""

    budget: RateBudget
    first: float
    calls: int
    made: int = 0

    async def call(self) -> float:
        """Wait for the next call's slot; the seconds waited. Past the reserved calls, a near free slot or
        :class:`BudgetShortfall`."""
        if self.made < self.calls:
            at = self.first + self.made / self.budget.per_second
            self.made += 1
            wait = max(0.0, at - time.monotonic())
            if wait:
                await asyncio.sleep(wait)
            return wait
        waited = await self.budget.acquire(max_wait=TAKE_WITHIN_SECONDS, shortfall_of=self.made)
        self.made += 1
        return waited


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


class RateBudget:
    """One per process and upstream; every call takes a slot first (``acquire``, or a sync's ``Reservation``)."""

    def __init__(self, redis: Redis, *, name: str, per_second: int, namespace: str = "") -> None:
        self.redis = redis
        self.name = name
        self.per_second = per_second
        prefix = f"{namespace}upstream:{name}:"
        self.log_key = f"{prefix}budget"
        """The calls admitted or reserved (scores: microseconds, by Redis' clock)."""
        self._keys = [self.log_key, f"{prefix}budget:processes", f"{prefix}backoff"]
        self._reservation_prefix = f"{prefix}reservation:"
        """Reservations, one key per subject (microseconds, by Redis' clock)."""
        self._script = LuaScript(redis, BUDGET_LUA)
        self._admit = LuaScript(redis, ADMIT_LUA)
        self.made_key = f"{prefix}budget:made"
        """The calls actually made (scores: microseconds, by Redis' clock): at most N in any window."""
        self._process = secrets.token_hex(6)
        self._calls = itertools.count()
        self._processes_seen = 1
        self._local: _LocalShare | None = None
        self._lock = asyncio.Lock()

    async def acquire(self, *, max_wait: float = MAX_WAIT_SECONDS, shortfall_of: int | None = None) -> float:
        """Wait for a slot; returns the seconds waited. Raises ``BudgetExhaustedError`` past ``max_wait``.

        ``shortfall_of``: the caller is a sync that made that many calls of its reservation: past ``max_wait`` it is
        told :class:`BudgetShortfall` instead (it gives back what it holds and reserves more slots).
        """
        started = time.monotonic()
        while True:
            elapsed = time.monotonic() - started
            status, wait, _ = await self._run("acquire", None, 1, max_wait - elapsed)
            if status == _RESERVED:
                if wait > 0:
                    await asyncio.sleep(wait)
                return time.monotonic() - started
            if elapsed + wait > max_wait:
                if shortfall_of is not None:
                    raise BudgetShortfall(shortfall_of)
                raise BudgetExhaustedError(
                    f"The {self.name} budget ({self.per_second}/s) had no free slot within {max_wait:g} s: "
                    "the fleet is draining a backlog; retried shortly.",
                    after_seconds=2.0,
                )
            await asyncio.sleep(wait)

    async def reserve(self, subject: str, calls: int) -> float:
        """Reserve ``calls`` slots for ``subject`` (or find the one it holds): seconds until it comes."""
        status, wait, _ = await self._run("reserve", subject, calls, 0.0)
        return wait if status in (_RESERVATION_MADE, _RESERVATION_AHEAD) else 0.0

    async def take(self, subject: str, calls: int) -> Reservation:
        """The subject's reservation, now or within ``TAKE_WITHIN_SECONDS``; else :class:`SlotLater` (its job comes
        back).

        A subject holding no reservation (it came too late for the one it had) reserves a new one here.
        """
        status, wait, reserved = await self._run("take", subject, calls, 0.0)
        if status == _RESERVED:
            return Reservation(self, time.monotonic() + wait, max(calls, reserved))
        if status == _NOT_RESERVED:  # paused after a 429
            raise SlotLater(
                f"The {self.name} budget ({self.per_second}/s) paused after a 429 for {wait:.1f} s", after_seconds=wait
            )
        raise SlotLater(
            f"The {self.name} budget ({self.per_second}/s): {subject}'s reserved slots come in {wait:.1f} s",
            after_seconds=max(wait - RESERVATION_EARLY_SECONDS, 0.05),
        )

    async def admit(self, *, max_wait: float = ADMIT_WAIT_SECONDS) -> float:
        """The moment of a call: wait while a second already holds N calls made; the seconds waited.

        Past ``max_wait`` (a pause after a 429, or a flood of late calls) ``SlotLater``: the caller comes back.
        With Redis away, this process keeps to its share (as :meth:`acquire` does).
        """
        started = time.monotonic()
        while True:
            try:
                wait_us = await self._admit(
                    keys=[self.made_key, self._keys[2]],
                    args=[self.per_second, WINDOW_US, f"{self._process}:{next(self._calls)}"],
                )
            except (RedisError, OSError):
                return 0.0  # the slot was taken from this process's share already
            wait = int(wait_us) / 1_000_000
            if wait <= 0:
                return time.monotonic() - started
            if time.monotonic() - started + wait > max_wait:
                raise SlotLater(
                    f"The {self.name} budget ({self.per_second}/s): no call may be made for {wait:.1f} s",
                    after_seconds=wait,
                )
            await asyncio.sleep(wait)

    async def paused_seconds(self) -> float:
        """How long every process still waits after a 429 (0: not paused)."""
        return max(0, int(await self.redis.pttl(self._keys[2]))) / 1000

    async def pause(self, seconds: float) -> None:
        """The upstream answered 429: no process takes a slot for ``seconds`` (best effort; never raises)."""
        try:
            await self.redis.set(self._keys[2], "1", px=max(1, int(seconds * 1000)))
        except (RedisError, OSError):
            await asyncio.sleep(seconds)

    async def _run(self, mode: str, subject: str | None, calls: int, may_wait: float) -> tuple[int, float, int]:
        """(status, seconds, the reservation's calls) of one script call; with Redis away, this process's share
        (reserved at once)."""
        try:
            status, wait_us, seen, reserved = await self._script(
                keys=[*self._keys, f"{self._reservation_prefix}{subject or ''}"],
                args=[
                    self.per_second,
                    f"{self._process}:{next(self._calls)}",
                    self._process,
                    WINDOW_US,
                    PARTICIPANT_TTL_US,
                    max(0, int(may_wait * 1_000_000)),
                    mode,
                    calls,
                    int(TAKE_WITHIN_SECONDS * 1_000_000),
                ],
            )
        except (RedisError, OSError) as exc:
            if mode == "reserve":
                return _RESERVATION_MADE, 0.0, calls  # the sync runs now and takes its slots from this process's share
            wait = await self._local_slot(exc)
            return (_RESERVED if wait <= 0 or mode == "take" else _NOT_RESERVED), wait, calls
        if self._local is not None:
            self._local = None
            logger.info("The %s budget: Redis answers again; the fleet shares one budget again.", self.name)
        self._processes_seen = max(1, int(seen))
        if status == _NOT_RESERVED:
            return _NOT_RESERVED, max(int(wait_us), 1000) / 1_000_000, 0
        return int(status), max(int(wait_us), 0) / 1_000_000, int(reserved)

    async def _local_slot(self, exc: BaseException) -> float:
        if self._local is None:
            share = max(1, self.per_second // self._processes_seen)
            self._local = _LocalShare(share)
            logger.warning(
                "The %s budget: Redis is unavailable (%s: %s); this process keeps to its share of %d calls "
                "per second (the budget of %d shared by the %d processes seen) until Redis answers.",
                self.name,
                type(exc).__name__,
                exc,
                share,
                self.per_second,
                self._processes_seen,
            )
        async with self._lock:
            return self._local.wait_seconds(time.monotonic())
