"""One call to an upstream: its rate, its gate (hold, pause, cap in flight), its outcome, its metrics and alerts.

``async with EMAIL.call(resources, subject) as call:`` wraps the request
itself. Before it: the job waits (``UpstreamHeld``, ``UpstreamPaused``: no
attempt spent, no slot, transaction or lock held, since it raises before the
job takes any) or takes its slot of the rate. After it, the outcome is
recorded by what the block raised:

- nothing: an answer;
- ``PermanentError`` (a 4xx), ``RetryLater`` (a 429), an ``HTTPStatusError``
  of a 4xx: an answer too, the upstream is up: never counted as a failure;
- anything else (a transport error, a timeout, a 5xx, the block's time
  limit): a failure of ``subject``. When it makes the upstream held, or it
  is held already, the job is told to wait (``UpstreamHeld``, from the
  failure) instead of spending an attempt.

An upstream declared with a health check confirms a hold with it before the
hold begins (it answers: the subjects fail on their own, and this failure is
its subject's), and probes a held upstream with it (it answers: the hold
ends, and the call that probed goes on).
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from app.core.metrics import UPSTREAM_CALLS, UPSTREAM_WAIT, child
from app.core.resources import Resources
from app.core.sentry import report_message
from app.core.tracing import traced_wait
from app.queue.errors import HTTPStatusError, PermanentError, RetryLater
from app.queue.upstreams.gate import GateStatus, Passage, Recorded, UpstreamGate
from app.queue.upstreams.rate import RateBudget, Reservation
from app.queue.upstreams.waits import UpstreamBusy, UpstreamHeld, UpstreamPaused, UpstreamWait

logger = logging.getLogger(__name__)

COME_BACK_SPREAD_SECONDS = 0.5
"""Jobs waiting for a probe come back spread over this much after it is due: the first is the probe."""
LEASE_MARGIN_SECONDS = 5.0
BUSY_WAIT_SECONDS = 2.0
"""A call waits this long at most, where it is, for a place under the cap in flight; then its job comes back."""
_BUSY_POLL_SECONDS = 0.05
_ERROR_MAX_CHARS = 500

HealthCheck = Callable[[Resources], Awaitable[object]]
"""An upstream's call that shows it answers whatever the subject, raising when it does not (``Upstream.health``)."""


@dataclass
class Call:
    """One call under way: how long it waited for its slot, and whether it is the probe of a held upstream."""

    upstream: str
    waited: float
    probe: bool


def describe(exc: BaseException) -> str:
    """An error as a hold's last error shows it (our messages: no secret, body or payload in them)."""
    return (f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)[:_ERROR_MAX_CHARS]


def answered(exc: BaseException) -> str | None:
    """The outcome label of a call that raised ``exc`` when the upstream did answer (a 4xx, a 429); else None."""
    if isinstance(exc, RetryLater):
        return "rate_limited"
    if isinstance(exc, PermanentError) or (isinstance(exc, HTTPStatusError) and 400 <= exc.status < 500):
        return "rejected"
    return None


class UpstreamCalls:
    """One per process and upstream: its budget (the rate) and its gate, and the calls that pass them."""

    def __init__(
        self,
        resources: Resources,
        *,
        name: str,
        per_second: int,
        in_flight: int | None,
        timeout_seconds: float,
        health: HealthCheck | None,
    ) -> None:
        settings = resources.settings
        self.name = name
        self.per_second = per_second
        self.timeout = timeout_seconds
        self.budget = RateBudget(resources.redis, name=name, per_second=per_second, namespace=settings.redis_namespace)
        self.gate = UpstreamGate(
            resources.redis,
            name=name,
            namespace=settings.redis_namespace,
            hold_after=settings.upstream_hold_after_subjects,
            probe_seconds=settings.upstream_probe_seconds,
            cap=in_flight,
            lease_seconds=timeout_seconds + LEASE_MARGIN_SECONDS,
        )
        self.probe_seconds = settings.upstream_probe_seconds
        self.health = health
        self.resources = resources
        self.unlisted = False
        """Called, but listed by no loaded module (said once, at its first call)."""

    async def check(self, subject: str) -> None:
        """Before a job takes anything (a reservation, a lock): raises ``UpstreamHeld``/``UpstreamPaused`` to wait."""
        self._wait_if_told(await self.gate.check(subject), subject)

    @asynccontextmanager
    async def call(self, subject: str, *, reservation: Reservation | None = None) -> AsyncIterator[Call]:
        """One call about ``subject`` (a customer, an object, a recipient): see the module's docstring.

        ``reservation``: the caller's reserved slots (a Stripe sync, which checked the gate before taking it).
        """
        if self.unlisted:
            self.unlisted = False
            logger.warning(
                "Upstream %s is called, but no module this process loads lists it in its upstreams: "
                "`upstreams list`, /ops and the metrics do not show it. Add it to its module's MODULE.",
                self.name,
            )
        token = secrets.token_hex(8)
        started = time.monotonic()
        with traced_wait(f"{self.name} budget"):  # a span of its own (tracing on): where a slow job's time went
            if reservation is None:
                await self.check(subject)
            await (reservation.call() if reservation is not None else self.budget.acquire())
            await self.budget.admit()
            passage = await self._enter(subject, token)
            if passage.verdict == "probe" and self.health is not None:
                await self._probe(token)  # its health is the probe, in this call's slot: UpstreamHeld while it fails
                await self.budget.acquire()  # the call itself takes a slot of its own: no two calls in one slot
                await self.budget.admit()
                token = secrets.token_hex(8)
                passage = await self._enter(subject, token)
        call = Call(self.name, time.monotonic() - started, passage.verdict == "probe")
        child(UPSTREAM_WAIT, self.name).observe(call.waited)
        try:
            async with asyncio.timeout(self.timeout):
                yield call
        except Exception as exc:
            await self._failed(subject, token, exc)
            raise
        child(UPSTREAM_CALLS, self.name, "ok").inc()
        await self._record(subject, token, None)

    async def pause(self, seconds: float | None) -> None:
        await self.gate.pause(seconds)

    async def resume(self) -> bool:
        return await self.gate.resume()

    async def status(self) -> GateStatus:
        return await self.gate.status()

    async def _enter(self, subject: str, token: str) -> Passage:
        started = time.monotonic()
        while True:
            passage = await self.gate.enter(subject, token)
            if passage.verdict != "full":
                self._wait_if_told(passage, subject)
                return passage
            if time.monotonic() - started > BUSY_WAIT_SECONDS:
                child(UPSTREAM_CALLS, self.name, "busy").inc()
                raise UpstreamBusy(
                    f"Upstream {self.name}: its cap of calls in flight stayed full for {BUSY_WAIT_SECONDS:g} s; "
                    "the job comes back in a second, no attempt spent.",
                    upstream=self.name,
                    after_seconds=1.0,
                )
            await asyncio.sleep(_BUSY_POLL_SECONDS)

    def _wait_if_told(self, passage: Passage, subject: str) -> None:
        if passage.verdict == "held":
            child(UPSTREAM_CALLS, self.name, "held").inc()
            raise self._held(passage.wait)
        if passage.verdict == "paused":
            child(UPSTREAM_CALLS, self.name, "paused").inc()
            left = "until resumed" if passage.pause_left is None else f"for another {passage.pause_left:.0f} s"
            raise UpstreamPaused(
                f"Upstream {self.name} is paused {left}: the job about {subject} waits, no attempt spent; "
                f"it looks again in {passage.wait:.0f} s.",
                upstream=self.name,
                after_seconds=passage.wait + random.uniform(0, COME_BACK_SPREAD_SECONDS),
            )

    def _held(self, wait: float) -> UpstreamHeld:
        return UpstreamHeld(
            f"Upstream {self.name} is held after an outage: the job waits for it, no attempt spent; "
            f"back in {wait:.1f} s, when the next probe is due.",
            upstream=self.name,
            after_seconds=wait + random.uniform(0, min(COME_BACK_SPREAD_SECONDS, self.probe_seconds / 4)),
        )

    async def _failed(self, subject: str, token: str, exc: Exception) -> None:
        """Record the outcome of a call that raised; raises ``UpstreamHeld`` when the failure finds it held."""
        if isinstance(exc, UpstreamWait):  # the block waited for another upstream: this call was not made
            await self.gate.record(subject, token, error=None, made=False)
            return
        label = answered(exc)
        if label is not None:
            child(UPSTREAM_CALLS, self.name, label).inc()
            await self._record(subject, token, None)
            return
        child(UPSTREAM_CALLS, self.name, "failed").inc()
        confirm = self.health is not None
        recorded = await self.gate.record(subject, token, error=describe(exc), confirm=confirm)
        if recorded.outcome == "began":
            if confirm:
                healthy, recorded = await self._health(token)
                if healthy:  # it answers: these subjects fail on their own, and this failure is its subject's
                    logger.info(
                        "Upstream %s: %d different subjects failed in a row, but it answers its health check: "
                        "no hold; they fail on their own (retried, then set aside as usual).",
                        self.name,
                        self.gate.hold_after,
                    )
                    return
            self._alert_hold(describe(exc))
        if recorded.outcome in ("began", "held"):
            raise self._held(recorded.seconds) from exc

    async def _probe(self, token: str) -> None:
        """The probe of a held upstream, by its health check: its answer ends the hold, its failure keeps it."""
        healthy, recorded = await self._health(token, in_slot=True)
        if healthy:
            self._said_ended(recorded)
            return
        raise self._held(recorded.seconds)

    async def _health(self, token: str, *, in_slot: bool = False) -> tuple[bool, Recorded]:
        """Call the health check under ``token`` (which holds the probe's claim): whether it answered, and what
        the gate recorded (the hold ended or not; still held, with the next probe's time).

        ``in_slot``: made in the slot its caller took and was admitted to (a probe); else it takes one."""
        assert self.health is not None
        if not in_slot:
            await self.budget.acquire()
            await self.budget.admit()
        try:
            async with asyncio.timeout(self.timeout):
                await self.health(self.resources)
        except Exception as exc:
            if answered(exc) is None:
                child(UPSTREAM_CALLS, self.name, "failed").inc()
                return False, await self.gate.record("health check", token, error=describe(exc))
        child(UPSTREAM_CALLS, self.name, "ok").inc()
        return True, await self.gate.record("health check", token, error=None)

    async def _record(self, subject: str, token: str, error: str | None) -> None:
        self._said_ended(await self.gate.record(subject, token, error=error))

    def _said_ended(self, recorded: Recorded) -> None:
        if recorded.outcome == "ended":
            logger.info(
                "Upstream %s answers again: its hold ended after %.0f s; the waiting jobs drain at %d calls "
                "per second.",
                self.name,
                recorded.seconds,
                self.per_second,
            )

    def _alert_hold(self, error: str) -> None:
        """The hold's one alert: an error line and one Sentry message, from the one process that began it."""
        message = (
            f"Upstream {self.name} is held: {self.gate.hold_after} different subjects failed in a row with no "
            f"success between; last error: {error}. Its jobs wait without spending attempts, one call every "
            f"{self.probe_seconds:g} s tests it, and the first answer ends the hold. Nothing to do; to stop even "
            f"those tests, `litestar upstreams pause {self.name}`."
        )
        logger.error(message)
        report_message(
            message,
            level="error",
            tags={"upstream": self.name},
            extras={"last_error": error},
            fingerprint=["upstream-held", self.name],
        )
