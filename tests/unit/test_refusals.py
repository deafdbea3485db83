"""Refused deliveries are logged at most once per provider, reason and minute, each line counting those it
summarises (docs/behaviour.md)."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pytest

from app.webhooks import refusals
from app.webhooks.refusals import Refusal, RefusalLog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The refusal log's own clock (its module's ``time``), moved by hand; nothing else's."""
    clock = Clock()
    monkeypatch.setattr(refusals, "time", SimpleNamespace(monotonic=clock.monotonic, time=time.time))
    return clock


def lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == "app.webhooks.refusals"]


def test_the_next_line_carries_the_count_of_the_refusals_it_summarises(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    log = RefusalLog()
    caplog.set_level(logging.WARNING, logger="app.webhooks.refusals")

    log.record("stripe", Refusal.SIGNATURE, "192.0.2.1", "Stripe signature does not match.")
    for seconds in range(1, 5):  # four more within the minute: no line
        clock.now += seconds
        log.record("stripe", Refusal.SIGNATURE, "192.0.2.1", "Stripe signature does not match.")
    assert len(lines(caplog)) == 1

    clock.now += 60  # the minute is over: the next refusal writes a line with the four it did not log
    log.record("stripe", Refusal.SIGNATURE, "192.0.2.9", "Stripe signature does not match.")
    first, second = lines(caplog)
    assert (first.refused_unlogged, second.refused_unlogged) == (0, 4)  # type: ignore[attr-defined]
    assert second.levelno == logging.WARNING
    assert "4 more refused for this reason since the previous line" in second.getMessage()
    assert "192.0.2.9" in second.getMessage()

    clock.now += 61  # a quiet minute: the next line counts nothing before it
    log.record("stripe", Refusal.SIGNATURE, "192.0.2.9", "Stripe signature does not match.")
    assert lines(caplog)[-1].refused_unlogged == 0  # type: ignore[attr-defined]


def test_each_provider_and_reason_has_its_own_line_and_count(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    log = RefusalLog()
    caplog.set_level(logging.WARNING, logger="app.webhooks.refusals")
    for _ in range(3):
        log.record("stripe", Refusal.SIGNATURE, "192.0.2.1", "bad signature")
        log.record("stripe", Refusal.TOO_LARGE, "192.0.2.1", "too large")
        log.record("clerk", Refusal.SIGNATURE, "192.0.2.1", "bad signature")
    assert [(r.provider, r.reason) for r in lines(caplog)] == [  # type: ignore[attr-defined]
        ("stripe", "rejected_signature"),
        ("stripe", "too_large"),
        ("clerk", "rejected_signature"),
    ]
    clock.now += 60
    log.record("clerk", Refusal.SIGNATURE, "192.0.2.1", "bad signature")
    assert (lines(caplog)[-1].provider, lines(caplog)[-1].refused_unlogged) == ("clerk", 2)  # type: ignore[attr-defined]
