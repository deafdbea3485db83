"""``python -m app.worker.health``: the worker container's healthcheck, by the worker's own heartbeat.

Exit 0 when a worker process of this host (the container: its hostname) beat
into Redis within the last 30 s (``app.queue.heartbeat``), else 1 with one
line saying why. A worker that froze, lost Redis for good or never started
stops beating, so Docker marks its container unhealthy; it reads the same
beats as ``/ops`` and the ``workers_alive`` metric. Light on purpose: the
settings and one Redis call, no app, no arq.
"""

from __future__ import annotations

import asyncio
import socket
import sys

from app.core.redis import make_redis
from app.core.settings import SettingsError, get_settings
from app.queue.heartbeat import ALIVE_WITHIN_SECONDS, beating_on

TIMEOUT_SECONDS = 5.0


async def check(host: str) -> str | None:
    """None when a worker of ``host`` beats, else what is wrong."""
    settings = get_settings()
    redis = make_redis(settings.require_redis_url(), timeout=TIMEOUT_SECONDS)
    try:
        beating = await beating_on(redis, settings, host)
    except Exception as exc:  # Redis unreachable: the worker cannot beat either
        return f"Redis did not answer ({type(exc).__name__}): no heartbeat can be read."
    finally:
        await redis.aclose()
    if not beating:
        return f"No worker of {host} beat within {ALIVE_WITHIN_SECONDS:g} s: frozen, stopped, or not started."
    return None


def main() -> int:
    host = socket.gethostname()
    try:
        problem = asyncio.run(check(host))
    except SettingsError as exc:
        problem = f"Configuration error: {exc}"
    print(problem or f"Worker of {host} alive.", file=sys.stderr if problem else sys.stdout)
    return 1 if problem else 0


if __name__ == "__main__":
    sys.exit(main())
