"""An upstream's gate, shared by the fleet in Redis: the outage hold, the operator's pause, the cap in flight.

- **Hold.** Each call's outcome is recorded (:meth:`UpstreamGate.record`). A
  failure (a transport error, a timeout, a 5xx) adds its subject to the set of
  subjects failing; any answer (a success, a 4xx, a 429) empties the set. When
  the set holds ``UPSTREAM_HOLD_AFTER_SUBJECTS`` subjects, that many distinct
  subjects failed in a row with no answer between: the upstream is held. One
  script does each step, so the count is exact across processes, and exactly
  one caller learns that the hold began (it alerts) and one that it ended.
- **Probe.** While held, calls wait until the probe is due (one every
  ``UPSTREAM_PROBE_SECONDS``); the first call that comes then is the probe
  (one process holds its claim). Its answer ends the hold; its failure sets
  the next probe. A probe whose process died frees its claim after the
  call's time limit.
- **Pause.** An operator's pause is one key, with the pause's end as its
  expiry (or none): every call checks it, so every process obeys at once, and
  it outlives restarts.
- **Cap in flight**: leases in a sorted set, each expiring with the call's
  time limit (a dead process's lease frees itself).

Redis unreachable: the gate stays open (the budget keeps each process to its
share meanwhile); no outcome is counted.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Literal

from redis.asyncio import Redis
from redis.exceptions import RedisError

from app.core.redis import LuaScript
from app.queue.upstreams.scripts import GATE_LUA, RECORD_LUA, STATUS_LUA

logger = logging.getLogger(__name__)

WAITING_GRACE_US = 5_000_000
"""A subject counts as waiting until this long past the time it was told to come back."""
PROBE_IN_FLIGHT_MIN_WAIT_US = 500_000
FAILING_TTL_MS = 86_400_000
_QUIET_SECONDS = 60.0


Verdict = Literal["go", "probe", "held", "paused", "full"]
_VERDICTS: tuple[Verdict, ...] = ("go", "probe", "held", "paused", "full")
Outcome = Literal["counted", "ended", "began", "held"]
_OUTCOMES: tuple[Outcome, ...] = ("counted", "ended", "began", "held")


@dataclass(frozen=True)
class Passage:
    """Whether a call may be made now, and if not, when to come back."""

    verdict: Verdict
    wait: float = 0.0
    """Seconds until the call may be tried again (held: the next probe; paused: its end, or the next look)."""
    pause_left: float | None = None
    """Paused: seconds until the pause ends by itself (None: until someone resumes it)."""


@dataclass(frozen=True)
class Recorded:
    outcome: Outcome
    seconds: float = 0.0
    """ended: how long it was held; began or held: seconds until the next probe."""


@dataclass(frozen=True)
class GateStatus:
    """An upstream's state as ``upstreams list`` and ``/ops`` show it."""

    state: Literal["ok", "held", "paused"]
    since: datetime | None
    """When the hold or the pause began."""
    until: datetime | None
    """Paused: when the pause ends by itself (None: until resumed)."""
    last_error: str | None
    last_error_at: datetime | None
    waiting: int
    """Subjects (jobs) waiting for it now."""

    @property
    def code(self) -> int:
        """As the metric ``upstream_state`` has it: 0 ok, 1 held, 2 paused."""
        return {"ok": 0, "held": 1, "paused": 2}[self.state]


def _at(micros: bytes | str | int) -> datetime | None:
    text = micros.decode() if isinstance(micros, bytes) else str(micros)
    return datetime.fromtimestamp(int(text) / 1_000_000, UTC) if text else None


class UpstreamGate:
    """One per process and upstream: asks Redis, in one script call each, whether a call may go, and records it."""

    def __init__(
        self,
        redis: Redis,
        *,
        name: str,
        namespace: str,
        hold_after: int,
        probe_seconds: float,
        cap: int | None,
        lease_seconds: float,
    ) -> None:
        self.redis, self.name = redis, name
        self.hold_after = hold_after
        self.probe_us = int(probe_seconds * 1_000_000)
        self.cap, self.lease_us = cap or 0, int(lease_seconds * 1_000_000)
        prefix = f"{namespace}upstream:{name}:"
        self.paused_key, self.state_key = f"{prefix}paused", f"{prefix}state"
        self._probe_key, self._leases_key = f"{prefix}probe", f"{prefix}in_flight"
        self._failing_key, self._waiting_key = f"{prefix}failing", f"{prefix}waiting"
        self._gate = LuaScript(redis, GATE_LUA)
        self._record = LuaScript(redis, RECORD_LUA)
        self._status = LuaScript(redis, STATUS_LUA)
        self._quiet_until = 0.0

    async def check(self, subject: str) -> Passage:
        """Before a job holds anything: go (a probe may be due, ``probe``), or how long to wait."""
        return await self._ask("check", subject, "")

    async def enter(self, subject: str, token: str) -> Passage:
        """The moment of the call: go (as the probe, when one is due and unclaimed), wait, or the cap is full."""
        return await self._ask("enter", subject, token)

    async def record(
        self, subject: str, token: str, *, error: str | None, made: bool = True, confirm: bool = False
    ) -> Recorded:
        """The call's outcome: ``error`` None when the upstream answered (a success, a 4xx, a 429); ``made``
        False when the call was not made after all (its lease and probe claim are given back, nothing counted);
        ``confirm``: a hold this failure begins is the caller's to confirm (it holds the probe's claim)."""
        mode = "released" if not made else "answered" if error is None else "failed"
        try:
            outcome, micros = await self._record(
                keys=[self.state_key, self._failing_key, self._probe_key, self._leases_key],
                args=[
                    mode,
                    subject,
                    token,
                    error or "",
                    self.hold_after,
                    self.probe_us,
                    FAILING_TTL_MS,
                    "1" if confirm else "0",
                    self.lease_us,
                ],
            )
        except (RedisError, OSError) as exc:
            self._unreachable(exc)
            return Recorded("counted")
        return Recorded(_OUTCOMES[int(outcome)], int(micros) / 1_000_000)

    async def pause(self, seconds: float | None) -> None:
        """No call goes until :meth:`resume` (or for ``seconds``); waiting jobs come back after it."""
        since = str(time.time_ns() // 1000)
        if seconds is None:
            await self.redis.set(self.paused_key, since)
        else:
            await self.redis.set(self.paused_key, since, px=max(1, int(seconds * 1000)))

    async def resume(self) -> bool:
        """Ends a pause; whether there was one."""
        return bool(await self.redis.delete(self.paused_key))

    async def status(self) -> GateStatus:
        now, pause_ms, paused_since, held_since, error, error_at, waiting = await self._status(
            keys=[self.paused_key, self.state_key, self._waiting_key]
        )
        last_error = (error.decode() if isinstance(error, bytes) else str(error)) or None
        status = GateStatus("ok", None, None, last_error, _at(error_at), int(waiting))
        if int(pause_ms) != -2:
            until = _at(int(now) + int(pause_ms) * 1000) if int(pause_ms) >= 0 else None
            return replace(status, state="paused", since=_at(paused_since), until=until)
        if held_since:
            return replace(status, state="held", since=_at(held_since))
        return status

    async def _ask(self, mode: str, subject: str, token: str) -> Passage:
        try:
            verdict, wait_us, left_us = await self._gate(
                keys=[self.paused_key, self.state_key, self._probe_key, self._leases_key, self._waiting_key],
                args=[
                    mode,
                    subject,
                    token,
                    self.cap,
                    self.lease_us,
                    self.probe_us,
                    WAITING_GRACE_US,
                    PROBE_IN_FLIGHT_MIN_WAIT_US,
                ],
            )
        except (RedisError, OSError) as exc:
            self._unreachable(exc)
            return Passage("go")
        left = None if int(left_us) < 0 else int(left_us) / 1_000_000
        return Passage(_VERDICTS[int(verdict)], int(wait_us) / 1_000_000, left)

    def _unreachable(self, exc: BaseException) -> None:
        if time.monotonic() >= self._quiet_until:
            self._quiet_until = time.monotonic() + _QUIET_SECONDS
            logger.warning(
                "Upstream %s: Redis is unavailable (%s: %s): its calls go on unchecked by its hold and pause, "
                "and their outcomes are not counted, until Redis answers.",
                self.name,
                type(exc).__name__,
                exc,
            )
