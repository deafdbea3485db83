"""Which workers are alive: each worker process beats every few seconds into one sorted set in Redis.

The API's ``/metrics`` (``workers_alive``) and the operations page read it; a
worker whose last beat is older than ``ALIVE_WITHIN_SECONDS`` counts as gone
(killed, frozen, or its host lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time

from redis.asyncio import Redis
from redis.exceptions import RedisError

from app.core.settings import Settings

BEAT_SECONDS = 10.0
ALIVE_WITHIN_SECONDS = 30.0


def _key(settings: Settings) -> str:
    return f"{settings.redis_namespace}workers"


def this_worker() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


async def beat_until(redis: Redis, settings: Settings, stopping: asyncio.Event) -> None:
    """Beat until ``stopping`` is set, then leave the set (a Redis outage only skips beats)."""
    key, member = _key(settings), this_worker()
    while not stopping.is_set():
        with contextlib.suppress(RedisError, OSError):
            now = time.time()
            await redis.zadd(key, {member: now})
            await redis.zremrangebyscore(key, "-inf", now - 10 * ALIVE_WITHIN_SECONDS)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(BEAT_SECONDS):
                await stopping.wait()
    with contextlib.suppress(RedisError, OSError):
        await redis.zrem(key, member)


async def beating_on(redis: Redis, settings: Settings, host: str) -> list[str]:
    """The workers of ``host`` (a container's hostname) that beat within ``ALIVE_WITHIN_SECONDS``."""
    return [worker for worker in await alive(redis, settings) if worker.rpartition(":")[0] == host]


async def alive(redis: Redis, settings: Settings) -> list[str]:
    """The workers (host:pid) that beat within ``ALIVE_WITHIN_SECONDS``."""
    members = await redis.zrangebyscore(_key(settings), time.time() - ALIVE_WITHIN_SECONDS, "+inf")
    return sorted(member.decode() if isinstance(member, bytes) else str(member) for member in members)
