"""The worker container's healthcheck (``python -m app.worker.health``): healthy while a worker of its host beats."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from app.core.resources import Resources
from app.queue.heartbeat import ALIVE_WITHIN_SECONDS
from app.testing.processes import child_env
from tests.processes import ROOT


def health(settings_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "app.worker.health"]
    return subprocess.run(command, cwd=ROOT, env=child_env(settings_env), capture_output=True, text=True, timeout=60)


async def test_healthy_while_a_worker_of_this_host_beats_and_unhealthy_once_it_stopped(
    settings_env: dict[str, str], resources: Resources
) -> None:
    key, host = f"{settings_env['REDIS_NAMESPACE']}workers", socket.gethostname()
    await resources.redis.zadd(key, {"another-host:7": time.time()})  # another container's worker: not this one's
    none = health(settings_env)
    await resources.redis.zadd(key, {f"{host}:7": time.time() - ALIVE_WITHIN_SECONDS - 5})
    stale = health(settings_env)
    await resources.redis.zadd(key, {f"{host}:7": time.time()})
    beating = health(settings_env)

    assert (none.returncode, stale.returncode, beating.returncode) == (1, 1, 0), (none, stale, beating)
    assert none.stderr.strip() == f"No worker of {host} beat within 30 s: frozen, stopped, or not started."
    assert beating.stdout.strip() == f"Worker of {host} alive."


def test_unhealthy_when_redis_does_not_answer(settings_env: dict[str, str]) -> None:
    gone = health({**settings_env, "REDIS_URL": "redis://127.0.0.1:1/0"})
    assert gone.returncode == 1 and gone.stderr.startswith("Redis did not answer"), gone
