"""Failure kinds a job can raise: anything else is retried with backoff."""

from __future__ import annotations

import logging
from typing import ClassVar


class PermanentError(Exception):
    """Retrying cannot help (a 4xx from an external API, invalid data): fail now, no retry."""


class RetryLater(Exception):
    """Run again after a delay: the remote side asked for it (HTTP 429 ``Retry-After``), or its budget slot is later.

    It is a try like any other (arq counts it); a job that defers itself often
    sets a ``retry_limit`` to match. Not reported to Sentry: it is not a fault.
    """

    log_level: ClassVar[int] = logging.WARNING
    """How the deferral is logged: a subclass that is routine (not a sign of trouble) logs it at info."""
    spends_attempt: ClassVar[bool] = True
    """False for a wait that is no try at all (an upstream held or paused, its slot of the budget later): the
    worker gives the try back, so a job may wait any number of times without nearing its ``retry_limit``."""

    def __init__(self, message: str, *, after_seconds: float) -> None:
        super().__init__(message)
        self.after_seconds = after_seconds


class RetryScheduled(Exception):
    """A try failed (or waited) and the job runs again in ``after_seconds``: ``run_attempt``'s answer to its runner.

    Raised from the job's own error. Only a runner that retries receives it: the
    worker hands it to its queue (``app.worker.arq_worker`` raises arq's
    ``Retry``); the sync driver and ``crons run`` run a single try.
    """

    def __init__(self, after_seconds: float) -> None:
        super().__init__(f"retried in {after_seconds:.1f} s")
        self.after_seconds = after_seconds


class QueueUnavailableError(Exception):
    """The queue (Redis) did not accept a job within the bounded wait."""


class UnknownJobError(Exception):
    """A job class is not registered in any loaded module."""


class HTTPStatusError(RuntimeError):
    """An external API answered an HTTP status that is retried (a 5xx, or 408, 425, 429 without ``Retry-After``)."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


_RETRYABLE_4XX = {408, 425, 429}


def error_for_http_status(status: int, message: str, *, retry_after: float | None = None) -> Exception:
    """Map an external HTTP status to the failure our job layer understands.

    4xx other than 408, 425 and 429 is permanent; 429 honours ``Retry-After``;
    everything else (5xx, timeouts) is an ordinary, retried error.
    """
    if status == 429 and retry_after is not None:
        return RetryLater(f"{message} (HTTP 429, retry after {retry_after:g}s)", after_seconds=retry_after)
    if 400 <= status < 500 and status not in _RETRYABLE_4XX:
        return PermanentError(f"{message} (HTTP {status}: not retried)")
    return HTTPStatusError(f"{message} (HTTP {status})", status=status)
