"""An upstream's gate against real Redis: the outage hold counted exactly across processes, its probe, the pause,
the cap in flight, and what counts as a failure."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

import pytest

from app.core.resources import Resources
from app.core.settings import load_settings
from app.queue.errors import HTTPStatusError, PermanentError, RetryLater
from app.queue.upstreams import Upstream, UpstreamHeld, UpstreamPaused, declared_upstreams
from app.queue.upstreams.gate import UpstreamGate
from app.runtime import open_resources

PING = Upstream("ping", per_second=100)
CAPPED = Upstream("capped", per_second=100, in_flight=2)

Open = Callable[..., Resources]


@pytest.fixture
async def open_process(settings_env: dict[str, str]) -> AsyncIterator[Open]:
    """A process's resources (each its own Redis connections), closed after the test."""
    opened: list[Resources] = []

    def open_(**env: str) -> Resources:
        opened.append(open_resources(load_settings({**settings_env, **env}), ()))
        return opened[-1]

    yield open_
    for resources in opened:
        await resources.close()


async def fail(resources: Resources, upstream: Upstream, subject: str, exc: Exception) -> BaseException | None:
    """One call about ``subject`` that raises ``exc``; what the caller then sees."""
    try:
        async with upstream.call(resources, subject):
            raise exc
    except BaseException as seen:
        return seen
    return None


async def succeed(resources: Resources, upstream: Upstream, subject: str) -> None:
    async with upstream.call(resources, subject):
        pass


async def test_distinct_subjects_failing_in_a_row_hold_the_upstream_exactly_once_across_processes(
    open_process: Open, caplog: pytest.LogCaptureFixture
) -> None:
    """Two processes record 2 x 10 failures of distinct subjects at once: one of them, exactly, begins the hold."""
    first, second = open_process(UPSTREAM_HOLD_AFTER_SUBJECTS="3"), open_process(UPSTREAM_HOLD_AFTER_SUBJECTS="3")
    gates = [PING.of(first).gate, PING.of(second).gate]

    async def failures(gate: UpstreamGate, side: str) -> list[str]:
        recorded = [
            await gate.record(f"{side}-{n}", f"t{side}{n}", error="ConnectionError: refused") for n in range(10)
        ]
        return [one.outcome for one in recorded]

    outcomes = [*await asyncio.gather(failures(gates[0], "a"), failures(gates[1], "b"))]
    flat = [outcome for side in outcomes for outcome in side]
    assert flat.count("began") == 1
    assert flat.count("counted") == 2  # the two failures before the third
    assert flat.count("held") == 17
    status = await gates[1].status()
    assert status.state == "held" and status.last_error == "ConnectionError: refused"

    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="app.queue.upstreams.calls"):
        seen = await fail(first, PING, "another", ConnectionError("refused again"))
    assert isinstance(seen, UpstreamHeld) and seen.spends_attempt is False
    assert [r.getMessage() for r in caplog.records] == []  # held already: no second alert


async def test_one_answer_between_failures_starts_the_count_again(open_process: Open) -> None:
    resources = open_process(UPSTREAM_HOLD_AFTER_SUBJECTS="2")
    for subject in ("a", "b"):
        assert isinstance(await fail(resources, PING, subject, HTTPStatusError("down", status=503)), HTTPStatusError)
        await succeed(resources, PING, "c")  # an answer between: no two failures in a row
    assert (await PING.of(resources).status()).state == "ok"
    for subject in ("a", "a", "a", "a"):  # one subject failing again and again is no outage
        await fail(resources, PING, subject, TimeoutError())
    assert (await PING.of(resources).status()).state == "ok"


@pytest.mark.parametrize(
    "answer",
    [PermanentError("HTTP 404"), HTTPStatusError("HTTP 429", status=429), RetryLater("429", after_seconds=1.0)],
    ids=["4xx", "429 without Retry-After", "429"],
)
async def test_an_answer_of_4xx_never_counts_toward_a_hold(open_process: Open, answer: Exception) -> None:
    resources = open_process(UPSTREAM_HOLD_AFTER_SUBJECTS="2")
    for n in range(5):
        assert await fail(resources, PING, f"subject-{n}", answer) is answer  # the caller's own error, untouched
    assert (await PING.of(resources).status()).state == "ok"


async def test_a_held_upstream_is_probed_once_per_interval_and_the_probes_answer_ends_the_hold(
    open_process: Open, caplog: pytest.LogCaptureFixture
) -> None:
    resources = open_process(UPSTREAM_HOLD_AFTER_SUBJECTS="1", UPSTREAM_PROBE_SECONDS="0.5")
    calls = PING.of(resources)
    held = await fail(resources, PING, "a", ConnectionError("refused"))
    assert isinstance(held, UpstreamHeld) and 0.4 < held.after_seconds <= 0.5 + 0.5 / 4
    with pytest.raises(UpstreamHeld):  # before the probe is due: no call is made
        await succeed(resources, PING, "b")

    await asyncio.sleep(0.55)
    assert (await calls.gate.enter("b", "token-b")).verdict == "probe"
    waiting = await calls.gate.enter("c", "token-c")
    assert waiting.verdict == "held" and 0.5 <= waiting.wait <= 1.0  # the probe is in flight: back shortly
    failed = await calls.gate.record("b", "token-b", error="ConnectionError: refused")
    assert failed.outcome == "held" and 0.45 < failed.seconds <= 0.5  # the next probe, an interval later

    await asyncio.sleep(0.55)
    with caplog.at_level(logging.INFO, logger="app.queue.upstreams.calls"):
        await succeed(resources, PING, "d")  # the probe: its answer ends the hold
    assert (await calls.status()).state == "ok"
    (ended,) = [r.getMessage() for r in caplog.records if "answers again" in r.getMessage()]
    assert ended.startswith("Upstream ping answers again: its hold ended after 1 s")
    await succeed(resources, PING, "e")


async def test_a_pause_stops_every_process_at_once_until_resumed_or_its_end(open_process: Open) -> None:
    operator, worker = open_process(UPSTREAM_PROBE_SECONDS="5"), open_process(UPSTREAM_PROBE_SECONDS="5")
    await PING.of(operator).pause(None)
    with pytest.raises(UpstreamPaused) as paused:
        await succeed(worker, PING, "a")
    assert paused.value.spends_attempt is False and 5 <= paused.value.after_seconds <= 5.5  # looks again then
    assert "paused until resumed" in str(paused.value)
    status = await PING.of(worker).status()
    assert status.state == "paused" and status.until is None and status.since is not None and status.waiting == 1

    assert await PING.of(operator).resume() is True
    await succeed(worker, PING, "a")
    assert (await PING.of(worker).status()).waiting == 0

    await PING.of(operator).pause(0.3)
    with pytest.raises(UpstreamPaused) as paused:
        await succeed(worker, PING, "a")
    assert paused.value.after_seconds <= 0.3 + 0.5
    await asyncio.sleep(0.35)
    await succeed(worker, PING, "a")  # the pause ended by itself


async def test_the_cap_in_flight_holds_the_third_call_until_one_ends(open_process: Open) -> None:
    resources = open_process()
    inside, release = 0, asyncio.Event()
    most = 0

    async def call(n: int) -> float:
        nonlocal inside, most
        async with CAPPED.call(resources, f"s{n}"):
            inside += 1
            most = max(most, inside)
            await release.wait()
            inside -= 1
        return time.monotonic()

    tasks = [asyncio.create_task(call(n)) for n in range(3)]
    await asyncio.sleep(0.3)
    assert (inside, most) == (2, 2)
    release.set()
    await asyncio.gather(*tasks)
    assert most == 2


def test_two_modules_declaring_one_name_differently_are_refused() -> None:
    from app.core.module import FeatureModule

    one = FeatureModule(name="one", upstreams=[Upstream("mail", per_second=5)])
    other = FeatureModule(name="other", upstreams=[Upstream("mail", per_second=6)])
    assert list(declared_upstreams([one, one])) == ["mail"]
    with pytest.raises(ValueError, match="declared twice"):
        declared_upstreams([one, other])
    with pytest.raises(ValueError, match="lowercase"):
        Upstream("Mail Provider", per_second=5)


HEALTH = {"up": True, "checks": 0}


async def _answers(resources: Resources) -> None:
    HEALTH["checks"] += 1
    if not HEALTH["up"]:
        raise ConnectionError("refused")


CHECKED = Upstream("checked", per_second=100, health=_answers)


async def test_with_a_health_check_a_hold_begins_only_if_it_fails_too_and_it_is_the_probe(open_process: Open) -> None:
    resources = open_process(UPSTREAM_HOLD_AFTER_SUBJECTS="2", UPSTREAM_PROBE_SECONDS="0.5")
    HEALTH.update(up=True, checks=0)
    for subject in ("a", "b"):  # two objects failing while nothing else is asked: it answers its check
        assert isinstance(await fail(resources, CHECKED, subject, ConnectionError("reset")), ConnectionError)
    assert HEALTH["checks"] == 1 and (await CHECKED.of(resources).status()).state == "ok"

    HEALTH["up"] = False
    for subject in ("c", "d"):
        seen = await fail(resources, CHECKED, subject, ConnectionError("refused"))
    assert isinstance(seen, UpstreamHeld) and (await CHECKED.of(resources).status()).state == "held"

    made = []

    async def call(subject: str) -> None:
        async with CHECKED.call(resources, subject):
            made.append(subject)

    await asyncio.sleep(0.55)
    with pytest.raises(UpstreamHeld):  # the probe is its check, which fails: the job's own call is not made
        await call("e")
    assert made == [] and HEALTH["checks"] == 3

    HEALTH["up"] = True
    await asyncio.sleep(0.55)
    await call("f")  # the check answers: the hold ends, and the call goes on
    assert made == ["f"] and (await CHECKED.of(resources).status()).state == "ok"
