"""One Stripe API budget for the fleet, slots reserved for syncs, and reads coalesced per subject."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Sequence
from urllib.parse import urlsplit

import pytest

from app.billing.budget import SlotLater, StripeBudget, stripe_budget, stripe_gateway
from app.core.redis import make_redis
from app.core.resources import Resources
from app.testing.processes import free_port
from app.testing.stripe_stub import StripeStub
from app.webhooks.inbox import Inbox
from app.webhooks.jobs import queue_processing
from app.webhooks.processing import process_event
from tests.billing.conftest import (
    OpenResources,
    comes_back,
    event_try,
    store,
    subscription_delivery,
    wait_for_stub_request,
    workspace_row,
)
from tests.factories import WorkspaceFactory, persist
from tests.processes import wait_for, worker_starter


def most_in_window(times: Sequence[float], window: float) -> int:
    """The most requests seen in any window of ``window`` seconds."""
    ordered = sorted(times)
    most, start = 0, 0
    for end, at in enumerate(ordered):
        while ordered[start] <= at - window:
            start += 1
        most = max(most, end - start + 1)
    return most


async def processed(resources: Resources, rows: Sequence[int]) -> bool:
    records = [await Inbox(resources.db).get(row_id) for row_id in rows]
    return all(record is not None and record.processed_at is not None for record in records)


@pytest.mark.slow
async def test_two_worker_processes_share_one_budget(
    billing_env: dict[str, str],
    open_resources: OpenResources,
    stripe_stub: StripeStub,
    webhook_secrets: dict[str, str],
) -> None:
    """40 customers to read by two workers with a budget of 5 calls per second: never more than 5 in a second."""
    intake = await open_resources(MESSAGE_QUEUE_DRIVER="arq")  # stores and queues, as the API does
    customers = [f"cus_budget_{n}" for n in range(40)]
    for customer in customers:
        await persist(intake.db, WorkspaceFactory.build(stripe_customer_id=customer))
        stripe_stub.put_customer(customer)
        stripe_stub.put_subscription(customer, quantity=4)
    env = {**billing_env, "MESSAGE_QUEUE_DRIVER": "arq", "STRIPE_API_RATE_LIMIT_PER_SECOND": "5"}
    rows = [await store(intake, subscription_delivery(webhook_secrets["stripe"], customer)) for customer in customers]
    async with worker_starter(env, "--queues", "webhook-stripe-queue,stripe-sync-queue") as start:
        await asyncio.gather(start(), start())
        for row_id in rows:
            await queue_processing(intake.queue, "stripe", row_id)

        await wait_for(lambda: processed(intake, rows), 60, "both workers to process the 40 events")
    times = stripe_stub.request_times
    assert len(times) == 40  # one read per customer
    # Slots are taken by Redis' clock; the stub counts arrivals, each later than its slot by a delay that varies
    # with the machine's load. In any 5 s the budget admits at most 25; arrivals delayed by anything under a
    # second add at most one second's worth: 30. Two budgets of 5 (not shared) let through 35 to 40.
    assert most_in_window(times, window=5.0) <= 5 * 5 + 5
    assert max(times) - min(times) >= 6.5  # 40 calls at 5 per second: at least 7 s between the first and last


async def test_a_burst_of_events_about_one_customer_costs_one_read(
    open_resources: OpenResources, stripe_stub: StripeStub, linked_workspace: object, webhook_secrets: dict[str, str]
) -> None:
    """40 events queued before any ran, four workers, a slow first read: one read, not 40."""
    workers = [await open_resources() for _ in range(4)]
    stripe_stub.put_subscription("cus_linked", id="sub_1", quantity=6)
    stripe_stub.slow("/v1/customers/cus_linked", seconds=0.5, times=1)
    secret = webhook_secrets["stripe"]
    rows = [await store(workers[0], subscription_delivery(secret, "cus_linked", id="sub_1")) for _ in range(40)]

    await asyncio.gather(*(process_event(workers[n % 4], row_id, "stripe") for n, row_id in enumerate(rows)))

    assert [path for _, path in stripe_stub.requests] == ["/v1/customers/cus_linked"]
    assert await processed(workers[0], rows)
    assert (await workspace_row(workers[0], linked_workspace.id)).member_limit == 6  # type: ignore[attr-defined]


async def test_an_event_sent_during_a_read_is_read_again(
    open_resources: OpenResources, stripe_stub: StripeStub, linked_workspace: object, webhook_secrets: dict[str, str]
) -> None:
    """Coalescing never swallows a change: an event received after a read began costs a read of its own."""
    first, second = await open_resources(), await open_resources()
    stripe_stub.put_subscription("cus_linked", id="sub_1", quantity=2)
    stripe_stub.slow("/v1/customers/cus_linked", seconds=0.5, times=1)
    secret = webhook_secrets["stripe"]
    early = await store(first, subscription_delivery(secret, "cus_linked", id="sub_1"))

    async def later_change() -> None:
        await wait_for_stub_request(stripe_stub, "GET", "/v1/customers/cus_linked")
        stripe_stub.put_subscription("cus_linked", id="sub_1", quantity=9)
        await process_event(second, await store(second, subscription_delivery(secret, "cus_linked", id="sub_1")))

    await asyncio.gather(process_event(first, early, "stripe"), later_change())
    assert len(stripe_stub.requests) == 2
    assert (await workspace_row(first, linked_workspace.id)).member_limit == 9  # type: ignore[attr-defined]


async def test_a_sync_is_queued_for_its_reservation_and_the_customer_s_other_events_reserve_none_of_their_own(
    open_resources: OpenResources, stripe_stub: StripeStub, linked_workspace: object, webhook_secrets: dict[str, str]
) -> None:
    """The next free slot is a second away: the first event's sync reserves it and is sent away until then (it holds
    no slot, transaction or lock meanwhile); the customer's second event finds that sync pending and reserves
    nothing. Back at its reservation, the sync reads once and covers both."""
    worker = await open_resources(STRIPE_API_RATE_LIMIT_PER_SECOND="1")
    stripe_stub.put_subscription("cus_linked", id="sub_1", quantity=5)
    budget = stripe_budget(worker)
    await budget.acquire()  # another caller's slot: the next one is a second from now
    secret = webhook_secrets["stripe"]
    first, second = [await store(worker, subscription_delivery(secret, "cus_linked", id="sub_1")) for _ in range(2)]

    sent_away = await event_try(worker, first)
    assert isinstance(sent_away, SlotLater) and 0.5 < sent_away.after_seconds < 1.0  # just before its reservation
    assert await event_try(worker, second) is None  # covered by the pending sync
    assert await budget.redis.zcard(budget.log_key) == 2  # the other caller's slot and the sync's, no third
    assert stripe_stub.requests == []

    await asyncio.sleep(sent_away.after_seconds)
    assert await comes_back(worker, "customer:cus_linked") is None

    assert [path for _, path in stripe_stub.requests] == ["/v1/customers/cus_linked"]
    for row_id in (first, second):
        row = await Inbox(worker.db).get(row_id)
        assert row is not None and row.processed_at is not None and row.attempts == 1 and row.last_error is None
    assert (await workspace_row(worker, linked_workspace.id)).member_limit == 5  # type: ignore[attr-defined]


async def test_callers_waiting_for_the_budget_are_given_their_slots_and_never_exceed_it(
    redis_url: str, redis_namespace: str
) -> None:
    """Two processes' budgets, 30 callers at once, 10 per second: each caller reserves its slot once (no
    caller asks Redis again and again while it waits), slots 0.1 s apart, never more than 10 in any second."""
    budgets = [StripeBudget(make_redis(redis_url), per_second=10, namespace=redis_namespace) for _ in range(2)]
    asked = 0
    calls: list[float] = []

    async def one_call(budget: StripeBudget) -> None:
        await budget.acquire()
        calls.append(time.monotonic())

    for budget in budgets:
        script = budget._script

        async def counted(*args: object, _script: object = script, **kwargs: object) -> object:
            nonlocal asked
            asked += 1
            return await _script(*args, **kwargs)  # type: ignore[operator]

        budget._script = counted  # type: ignore[assignment]
    started = time.monotonic()
    await asyncio.gather(*(one_call(budgets[n % 2]) for n in range(30)))
    assert asked == 30
    # The times admitted, by Redis' clock (the callers' own clocks read them a scheduling delay late).
    admitted = [score / 1e6 for _, score in await budgets[0].redis.zrange(budgets[0].log_key, 0, -1, withscores=True)]
    assert len(admitted) == 30 and most_in_window(admitted, 1.0) == 10
    assert min(later - earlier for earlier, later in itertools.pairwise(admitted)) >= 0.1 - 1e-6  # no burst
    assert most_in_window(calls, 0.9) <= 10
    assert 2.7 <= time.monotonic() - started < 4.5  # 30 calls 0.1 s apart: the last after 2.9 s
    for budget in budgets:
        await budget.redis.aclose()


async def test_a_429_pauses_every_process_for_its_retry_after(redis_url: str, redis_namespace: str) -> None:
    one = StripeBudget(make_redis(redis_url), per_second=100, namespace=redis_namespace)
    other = StripeBudget(make_redis(redis_url), per_second=100, namespace=redis_namespace)
    await one.pause(0.6)
    started = time.monotonic()
    waited = await other.acquire()
    assert waited >= 0.5 and time.monotonic() - started >= 0.5
    await one.redis.aclose()
    await other.redis.aclose()


async def test_with_redis_away_a_process_keeps_to_its_share_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    budget = StripeBudget(make_redis(f"redis://127.0.0.1:{free_port()}/0"), per_second=4)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="app.queue.upstreams.rate"):
        for _ in range(8):
            await budget.acquire()
    assert time.monotonic() - started >= 0.9  # 4 per second: the second four waited for the first to age
    warnings = [record for record in caplog.records if "keeps to its share" in record.getMessage()]
    assert len(warnings) == 1
    await budget.redis.aclose()


async def test_a_429_makes_the_gateway_pause_every_process_through_the_budget(
    worker: Resources, stripe_stub: StripeStub, redis_url: str, linked_workspace: object
) -> None:
    """The gateway told to wait pauses the shared budget (not a sleep of its own): another process waits too."""
    gateway = stripe_gateway(worker)
    paused, pauses = asyncio.Event(), []
    pause = gateway.budget.pause

    async def spied_pause(seconds: float) -> None:
        pauses.append(seconds)
        await pause(seconds)
        paused.set()

    gateway.budget.pause = spied_pause  # type: ignore[method-assign]
    other = StripeBudget(make_redis(redis_url), per_second=100, namespace=worker.settings.redis_namespace)
    stripe_stub.rate_limit("/v1/customers", retry_after=1, times=1)

    async def other_process() -> float:
        await asyncio.wait_for(paused.wait(), 5)
        return await other.acquire()

    try:
        billing, waited = await asyncio.gather(gateway.customer_billing("cus_linked"), other_process())
    finally:
        await other.redis.aclose()
    assert pauses == [1.0]
    assert waited >= 0.8  # the rest of Stripe's Retry-After of 1 s
    assert billing.customer_id == "cus_linked"
    assert [path for _, path in stripe_stub.requests].count("/v1/customers/cus_linked") == 2  # 429, then read


class RedisPath:
    """A TCP relay to Redis that a test can cut: the process using it finds Redis away, the others do not."""

    def __init__(self, redis_url: str) -> None:
        parsed = urlsplit(redis_url)
        self.target = (parsed.hostname or "127.0.0.1", parsed.port or 6379)
        self.database = parsed.path
        self.writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> RedisPath:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.url = f"redis://127.0.0.1:{self.server.sockets[0].getsockname()[1]}{self.database}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cut()

    def cut(self) -> None:
        self.server.close()
        for writer in self.writers:
            writer.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.writers += [writer, up_writer]

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def test_with_redis_away_the_budget_is_divided_between_the_processes_seen(
    redis_url: str, redis_namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two processes took slots in the last ten seconds: each keeps to half the budget once Redis is gone."""
    async with RedisPath(redis_url) as path:
        one = StripeBudget(make_redis(path.url), per_second=4, namespace=redis_namespace)
        other = StripeBudget(make_redis(redis_url), per_second=4, namespace=redis_namespace)
        await other.acquire()
        await one.acquire()  # sees two processes
        await asyncio.sleep(1.0)  # both slots aged out of the window
        path.cut()  # Redis is away, for this process

        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="app.queue.upstreams.rate"):
            for _ in range(6):
                await one.acquire()
        elapsed = time.monotonic() - started
    await one.redis.aclose()
    await other.redis.aclose()
    assert elapsed >= 1.9  # 2 per second: the last two waited two seconds (a share of 4 would take one)
    (warning,) = [r.getMessage() for r in caplog.records if "keeps to its share" in r.getMessage()]
    assert "share of 2 calls per second (the budget of 4 shared by the 2 processes seen)" in warning


async def test_calls_made_late_are_still_never_more_than_the_budget_in_any_second(
    redis_url: str, redis_namespace: str
) -> None:
    """Reservations schedule the calls; the moment of each call keeps the bound: twelve calls made at once (syncs that
    waited for their locks past their reservations) are admitted five a second, never six."""
    budget = StripeBudget(make_redis(redis_url), per_second=5, namespace=redis_namespace)
    made: dict[bytes, float] = {}  # each call as the budget logged it (by Redis' clock)

    async def call() -> None:
        await budget.admit(max_wait=5)
        made.update(await budget.redis.zrange(budget.made_key, 0, -1, withscores=True))

    try:
        started = time.monotonic()
        await asyncio.gather(*(call() for _ in range(12)))
        elapsed = time.monotonic() - started
    finally:
        await budget.redis.aclose()
    assert len(made) == 12 and most_in_window([score / 1e6 for score in made.values()], 1.0) == 5
    assert elapsed >= 2.0  # the last two waited for the second and third seconds


async def test_a_reservation_of_more_calls_gives_them_to_the_job_that_takes_it(
    redis_url: str, redis_namespace: str
) -> None:
    """A sync short of calls reserves more slots, and its job comes back with the data it had (asking for
    one call): taking the reservation must give it the calls reserved, or it falls short again at every try."""
    budget = StripeBudget(make_redis(redis_url), per_second=20, namespace=redis_namespace)
    try:
        for _ in range(10):  # the budget's next half second is taken: the reservation is made ahead
            await budget.acquire()
        wait = await budget.reserve("checkout:cs_1", 3)
        assert wait > 0
        await asyncio.sleep(max(wait - 0.3, 0))
        reservation = await budget.take("checkout:cs_1", 1)
        assert reservation.calls == 3
        for _ in range(3):
            await reservation.call()  # the third is the reservation's own, not a free slot found by luck
        assert reservation.made == 3
    finally:
        await budget.redis.aclose()
