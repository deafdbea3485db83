"""The one way to build a Redis client: bounded waits, so a dead or hung Redis never hangs a request."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

FAST_TIMEOUT_SECONDS = 1.0


def make_redis(
    url: str, *, timeout: float = FAST_TIMEOUT_SECONDS, per_command: bool = True, client: type[Redis] = Redis
) -> Redis:
    """A client of ``client``'s class (arq's pool is one) that gives up after ``timeout``.

    ``per_command=False`` is for hot paths that bound each whole call with
    ``asyncio.timeout`` themselves (intake's rate limiter, enqueueing): no
    per-read timeout and no idle health check, each of which costs an extra
    timer or check per command, about a third of redis-py's client CPU per
    command (72 -> 49 us per EVALSHA at 32 concurrent callers). A cancelled
    call disconnects its connection, so no late reply is read by the next one.
    """
    if per_command:
        return client.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            health_check_interval=30,
            retry_on_timeout=False,
        )
    return client.from_url(url, socket_connect_timeout=timeout, retry_on_timeout=False)


class LuaScript:
    """A Lua script run by its SHA, loaded again if the server forgot it: what ``Redis.register_script`` gives.

    Written here for one measured reason: redis-py's ``AsyncScript.__call__``
    first checks ``isinstance(client, Pipeline)``, which goes through
    ``typing.Protocol``'s slow instance check on every call: 3% of the intake's
    CPU (its rate limiter and its enqueue each run one script per delivery).
    """

    def __init__(self, redis: Redis, script: str) -> None:
        self.redis = redis
        self.script = script
        self.sha = hashlib.sha1(script.encode()).hexdigest()

    async def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        try:
            return await self.redis.evalsha(self.sha, len(keys), *keys, *args)  # type: ignore[misc]
        except NoScriptError:  # a restarted or different server: load it, once
            self.sha = await self.redis.script_load(self.script)
            return await self.redis.evalsha(self.sha, len(keys), *keys, *args)  # type: ignore[misc]
