"""What a job that needs an upstream is told when it must wait: ``RetryLater``s that spend no attempt."""

from __future__ import annotations

import logging

from app.queue.errors import RetryLater


class UpstreamWait(RetryLater):
    """The job comes back after ``after_seconds`` holding nothing meanwhile; no attempt spent, no Sentry error."""

    log_level = logging.INFO
    spends_attempt = False

    def __init__(self, message: str, *, upstream: str, after_seconds: float) -> None:
        super().__init__(message, after_seconds=after_seconds)
        self.upstream = upstream


class UpstreamHeld(UpstreamWait):
    """The upstream is held after an outage: its jobs wait for a probe to find it answering."""


class UpstreamPaused(UpstreamWait):
    """An operator paused the upstream (``litestar upstreams pause``): its jobs wait for the pause to end."""


class UpstreamBusy(UpstreamWait):
    """The upstream's cap of calls in flight stayed full: the job comes back a moment later."""
