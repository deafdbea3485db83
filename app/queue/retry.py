"""The one retry policy: exponential backoff with +-20% jitter, capped per job class."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable

from app.queue.errors import RetryLater
from app.queue.job import RetryPolicy

JITTER = 0.2
# A 429's Retry-After is honoured, but a remote side asking for days is not.
MAX_RETRY_LATER_SECONDS = 24 * 3600.0


def _doubling(policy: RetryPolicy, attempt: int) -> float:
    """Base, 2x base, 4x base... for ``attempt`` 1, 2, 3... (the exponent capped so it cannot overflow)."""
    return policy.backoff_base_seconds * 2.0 ** min(max(attempt - 1, 0), 64)


def backoff_seconds(
    policy: RetryPolicy, attempt: int, *, uniform: Callable[[float, float], float] = random.uniform
) -> float:
    """Delay before the try after ``attempt`` (1-based): doubling from the base, +-20%, never over the cap."""
    return min(policy.backoff_cap_seconds, _doubling(policy, attempt) * uniform(1 - JITTER, 1 + JITTER))


def retry_delay(policy: RetryPolicy, attempt: int, exc: BaseException) -> float:
    if isinstance(exc, RetryLater):
        return min(max(exc.after_seconds, 0.0), MAX_RETRY_LATER_SECONDS)
    return backoff_seconds(policy, attempt)


MAX_EXPIRES_SECONDS = 30 * 24 * 3600.0
"""A job that reschedules itself without end (a sync) lives this long at most; recovery queues its work again."""


@functools.lru_cache(maxsize=256)  # a pure function of a few values, asked for each job queued (the intake's)
def expires_after_seconds(policy: RetryPolicy, retry_limit: int, delay_seconds: float) -> float:
    """How long the queued job must live in Redis to survive every retry (arq does not refresh it)."""
    budget = delay_seconds + 24 * 3600.0
    for attempt in range(1, retry_limit + 1):
        budget += backoff_seconds(policy, attempt, uniform=lambda _, high: high) + policy.timeout_seconds
        if budget >= MAX_EXPIRES_SECONDS:
            return MAX_EXPIRES_SECONDS
    return budget
