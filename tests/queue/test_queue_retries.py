"""Retries: backoff bounds, the retry limit, PermanentError, and one Sentry error per failed try."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from app.core.resources import Resources
from app.queue.errors import HTTPStatusError, PermanentError, RetryLater, error_for_http_status
from app.queue.job import RetryPolicy
from app.queue.retry import backoff_seconds, retry_delay
from tests.queue.conftest import fetch_events, wait_for
from tests.queue.sample_jobs import RecordData, RecordJob
from tests.stubs.sentry_ingest import SentryIngestStub, exception_types

POLICY = RetryPolicy(retry_limit=10, backoff_base_seconds=5.0, backoff_cap_seconds=300.0, timeout_seconds=60)


def test_backoff_doubles_with_jitter_within_twenty_percent_and_never_exceeds_the_cap() -> None:
    rng = random.Random(7)
    previous_low = 0.0
    for attempt in range(1, 16):
        nominal = 5.0 * 2 ** (attempt - 1)
        low = backoff_seconds(POLICY, attempt, uniform=lambda a, b: a)
        high = backoff_seconds(POLICY, attempt, uniform=lambda a, b: b)
        assert low == pytest.approx(min(300.0, nominal * 0.8))
        assert high == pytest.approx(min(300.0, nominal * 1.2))
        samples = [backoff_seconds(POLICY, attempt, uniform=rng.uniform) for _ in range(500)]
        assert all(low <= s <= high <= 300.0 for s in samples)
        if nominal * 1.2 < 300.0:
            assert max(samples) - min(samples) > 0.25 * nominal  # the jitter really spreads the retries
        assert low >= previous_low  # never shrinks from one try to the next
        previous_low = low
    assert backoff_seconds(POLICY, 1, uniform=lambda a, b: 1.0) == 5.0
    assert backoff_seconds(POLICY, 3, uniform=lambda a, b: 1.0) == 20.0
    assert backoff_seconds(POLICY, 10_000) == 300.0


def test_retry_later_honours_the_delay_the_remote_side_asked_for() -> None:
    assert retry_delay(POLICY, 1, RetryLater("429", after_seconds=42)) == 42
    assert 4.0 <= retry_delay(POLICY, 1, RuntimeError("boom")) <= 6.0


@pytest.mark.parametrize(
    ("status", "retry_after", "kind"),
    [
        (404, None, PermanentError),
        (401, None, PermanentError),
        (408, None, HTTPStatusError),
        (425, None, HTTPStatusError),
        (429, 30.0, RetryLater),
        (500, None, HTTPStatusError),
        (503, None, HTTPStatusError),
    ],
)
def test_http_statuses_map_to_the_right_failure(status: int, retry_after: float | None, kind: type) -> None:
    error = error_for_http_status(status, "Stripe said no", retry_after=retry_after)
    assert type(error) is kind
    if retry_after is not None:
        assert isinstance(error, RetryLater) and error.after_seconds == retry_after


def _job_events(sentry: SentryIngestStub, message: str) -> list[dict[str, Any]]:
    """Events whose exception message ends with ``message``."""
    return [e for e in sentry.events if any(v.get("value", "").endswith(message) for v in e["exception"]["values"])]


@pytest.mark.slow
async def test_retry_limit_permanent_error_and_one_sentry_error_per_failed_try(
    events_table: Resources, start_worker: Callable[..., Any], sentry_stub: SentryIngestStub
) -> None:
    resources = events_table
    worker = await start_worker(SENTRY_DSN=sentry_stub.dsn)
    queue = resources.queue

    await queue.add(RecordJob, RecordData(key="always", fail_times=99), retry_limit=2, deduplication_id="always")
    await queue.add(RecordJob, RecordData(key="once", fail_times=1), retry_limit=3, deduplication_id="once")
    await queue.add(RecordJob, RecordData(key="perm", permanent=True), retry_limit=5, deduplication_id="perm")
    later = RecordData(key="later", fail_times=1, retry_later_seconds=0.2)  # a 429: deferred, not a fault
    await queue.add(RecordJob, later, retry_limit=3, deduplication_id="later")

    async def settled() -> bool:
        states = [await queue.state(key, "default-queue") for key in ("always", "once", "perm", "later")]
        return states == ["absent"] * 4

    await wait_for(settled, 20, "the three jobs to finish or fail for good")
    await wait_for(lambda: len(sentry_stub.events) >= 5, 10, "five Sentry events")

    starts = {
        key: [e["attempt"] for e in await fetch_events(resources) if e["key"] == key and e["event"] == "start"]
        for key in ("always", "once", "perm", "later")
    }
    assert starts == {"always": [1, 2, 3], "once": [1, 2], "perm": [1], "later": [1, 2]}
    ends = [e["key"] for e in await fetch_events(resources) if e["event"] == "end"]
    assert sorted(ends) == ["later", "once"]

    always = _job_events(sentry_stub, "of always")
    assert sorted(str(e["tags"]["attempt"]) for e in always) == ["1", "2", "3"]
    assert {str(e["tags"]["attempt"]): e["tags"]["final"] for e in always} == {"1": "no", "2": "no", "3": "yes"}
    assert {e["tags"]["job_name"] for e in always} == {"RecordJob"}
    assert {e["tags"]["queue"] for e in always} == {"default-queue"}
    assert all(exception_types(e) == ["RuntimeError"] for e in always)
    assert len({tuple(e["fingerprint"]) for e in always}) == 1  # every retry groups into one issue
    once = _job_events(sentry_stub, "of once")
    assert [e["tags"]["final"] for e in once] == ["no"]
    perm = _job_events(sentry_stub, "of perm")
    assert [(str(e["tags"]["attempt"]), e["tags"]["final"]) for e in perm] == [("1", "yes")]
    assert exception_types(perm[0]) == ["PermanentError"]
    assert _job_events(sentry_stub, "of later") == []
    assert len(sentry_stub.events) == 5

    deferred = [line for line in worker.lines() if "deferred on attempt" in str(line.get("event"))]
    assert [(line["level"], "of later" in line["event"]) for line in deferred if line["level"] == "warning"] == [
        ("warning", True)
    ]

    failures = [line["event"] for line in worker.lines() if "failed on attempt" in str(line.get("event"))]
    assert any("attempt 3 of 3 (final: no retries left)" in line for line in failures)
    assert any("attempt 1 of 6 (final: PermanentError, not retried)" in line for line in failures)
    assert any("attempt 1 of 3 (retrying in" in line for line in failures)
    traced = [line for line in worker.lines() if "failed on attempt" in str(line.get("event"))]
    assert all("exception" in line for line in traced)  # each failed try logs its traceback
