"""The load loop's sending side: signed POSTs on 127.0.0.1, bounded, re-sent as a provider would.

Every delivery is signed when it is sent (a provider signs each attempt anew)
and carries an ``X-Forwarded-For`` from a pool of provider addresses (the API
trusts 127.0.0.1 as its proxy). A 5xx, a 429, a timeout or a refused connection
is sent again with backoff until a 200 or ``resend_deadline_seconds``; a 4xx
other than 429 is a finding, never re-sent. At most ``concurrency`` requests are
in flight; every attempt is recorded for the table and the rate-limit check.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import httpx

from app.testing.deliveries import signed_clerk_delivery, signed_stripe_delivery
from bench.soak.config import SoakConfig
from bench.soak.plan import Event

NOISY_IP = "203.0.113.66"


@dataclass
class Stats:
    answers: Counter[str] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    # (route, client ip) -> (sent, answered) of each request the limiter let through
    admitted: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)
    attempts: int = 0
    resends: int = 0
    noisy_sent: int = 0
    noisy_answers: Counter[str] = field(default_factory=Counter)
    undelivered: list[Event] = field(default_factory=list)


class Sender:
    def __init__(self, config: SoakConfig, api_urls: list[str], secrets: dict[str, str], rng: random.Random) -> None:
        self.config = config
        self.api_urls = api_urls
        self.secrets = secrets
        self.rng = rng
        self.stats = Stats()
        self.ips = [f"10.80.{i // 250}.{i % 250 + 1}" for i in range(config.normal_ips)]
        self._next_api = itertools.count()
        self._inflight = asyncio.Semaphore(config.concurrency)
        limits = httpx.Limits(max_connections=config.concurrency, max_keepalive_connections=config.concurrency)
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(20.0), limits=limits)
        self.tasks: set[asyncio.Task[None]] = set()
        self.accepted_stripe: list[Event] = []  # redelivered by the noisy IP
        self.some_accepted = asyncio.Event()

    async def close(self) -> None:
        await self.client.aclose()

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def wait_idle(self, within: float) -> bool:
        """Until every delivery (with its re-sends) is done; False if some still run after ``within`` s."""
        deadline = time.monotonic() + within
        while self.tasks:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await asyncio.wait(list(self.tasks), timeout=left)
        return True

    def emit(self, event: Event) -> None:
        """The event's planned deliveries: one now, its duplicates now (concurrent) or a little later."""
        self.spawn(self.deliver(event))
        for _ in range(event.copies - 1):
            if event.concurrent:
                self.spawn(self.deliver(event))
            else:
                delay = self.rng.uniform(0.1, 1.0) if event.doomed else self.rng.uniform(0.5, 12.0)
                self.spawn(self._later(delay, event))

    async def _later(self, delay: float, event: Event) -> None:
        await asyncio.sleep(delay)
        await self.deliver(event)

    async def deliver(self, event: Event, *, ip: str | None = None, resend: bool = True) -> None:
        event.sends += 1
        backoff = 0.25
        deadline = time.monotonic() + self.config.resend_deadline_seconds
        while True:
            status, retry_after = await self._post(event, ip or self.rng.choice(self.ips))
            if status == "200":
                if not event.accepted and event.provider == "stripe" and not event.doomed and not event.ignored:
                    self.accepted_stripe.append(event)
                    self.some_accepted.set()
                event.accepted = True
                return
            if not resend:
                return
            if status.isdigit() and 400 <= int(status) < 500 and status != "429":
                event.rejected = int(status)
                return
            if time.monotonic() > deadline:
                self.stats.undelivered.append(event)
                return
            self.stats.resends += 1
            await asyncio.sleep(retry_after if retry_after is not None else backoff * self.rng.uniform(0.8, 1.2))
            backoff = min(backoff * 2, 5.0)

    async def _post(self, event: Event, ip: str) -> tuple[str, float | None]:
        assert event.payload is not None, f"{event.type} {event.event_id} has no payload yet"
        if event.provider == "stripe":
            delivery = signed_stripe_delivery(event.payload, self.secrets["stripe"])
        else:
            delivery = signed_clerk_delivery(event.payload, self.secrets["clerk"], msg_id=event.event_id)
        url = f"{self.api_urls[next(self._next_api) % len(self.api_urls)]}/webhooks/{event.provider}"
        headers = {**delivery.headers, "X-Forwarded-For": ip}
        retry_after: float | None = None
        async with self._inflight:
            sent = time.monotonic()
            try:
                response = await self.client.post(url, content=delivery.body, headers=headers)
            except httpx.TimeoutException:
                status = "timeout"
            except httpx.TransportError:
                status = "connection error"
            else:
                status = str(response.status_code)
                if response.status_code == 429:
                    retry_after = float(response.headers.get("retry-after", "1"))
            answered = time.monotonic()
        stats = self.stats
        stats.attempts += 1
        if ip == NOISY_IP:
            stats.noisy_sent += 1
            stats.noisy_answers[status] += 1
        stats.answers[status] += 1
        if status.isdigit():
            stats.latencies_ms.append((answered - sent) * 1000)
            if status in ("200", "503"):  # past the limiter (a 503 is Postgres failing after it)
                stats.admitted.setdefault((event.provider, ip), []).append((sent, answered))
        return status, retry_after

    async def noisy(self, start: float, length: float, driver: Any) -> None:
        """One client IP over the limit on purpose: redeliveries of accepted Stripe events, never re-sent.

        From ``start`` (run seconds) or once Redis is back from its restart, whichever is later.
        """
        count = self.config.rate_limit * self.config.noisy_requests_per_limit
        step = max(length, 1.0) / count
        await driver.at(start)
        await driver.redis_back.wait()
        began = time.monotonic()
        for index in range(count):
            await asyncio.sleep(max(0.0, began + index * step - time.monotonic()))
            await self.some_accepted.wait()
            self.spawn(self.deliver(self.rng.choice(self.accepted_stripe), ip=NOISY_IP, resend=False))


def max_admitted_in_window(admitted: list[tuple[float, float]], window: float = 60.0) -> int:
    """The most requests surely admitted within one window: sent at or after its start, answered before its end.

    The limiter decides somewhere between a request's send and its answer, so this
    count never includes one it did not admit inside the window: no false alarm.
    """
    ordered = sorted(admitted)
    best = 0
    for i, (start, _) in enumerate(ordered):
        inside = 0
        for sent, answered in ordered[i:]:
            if sent >= start + window:
                break
            if answered < start + window:
                inside += 1
        best = max(best, inside)
    return best


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]
