"""Redis clients with bounded waits: a dead or hung Redis must never hang a request."""

from __future__ import annotations

from redis.asyncio import Redis

FAST_TIMEOUT_SECONDS = 1.0


def make_redis(url: str, *, timeout: float = FAST_TIMEOUT_SECONDS) -> Redis:
    return Redis.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        health_check_interval=30,
        retry_on_timeout=False,
    )
