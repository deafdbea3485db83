"""Fixtures of the queue tests: the test table, real worker processes, a private redis-server."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from app.core.resources import Resources
from tests.queue.sample_jobs import CREATE_TABLE

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_MODULE = "tests.queue.sample_jobs:MODULE"


@pytest.fixture
async def events_table(resources: Resources) -> Resources:
    async with resources.db.session() as session:
        await session.execute(text(CREATE_TABLE))
        await session.execute(text("TRUNCATE queue_test_event RESTART IDENTITY"))
        await session.commit()
    return resources


async def fetch_events(resources: Resources, job: str | None = None) -> list[dict[str, Any]]:
    query = "SELECT job, key, event, attempt, pid, at FROM queue_test_event"
    query += " WHERE job = :job ORDER BY id" if job else " ORDER BY id"
    async with resources.db.session() as session:
        rows = await session.execute(text(query), {"job": job} if job else {})
        return [dict(row._mapping) for row in rows]


async def wait_for(predicate: Callable[[], Any], within: float, what: str, step: float = 0.05) -> Any:
    """Poll an async (or plain) predicate until it returns something truthy."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what}")
        await asyncio.sleep(step)


@dataclass
class WorkerProc:
    """One ``python -m app.worker`` process; its JSON log lines are read from a file."""

    process: subprocess.Popen[bytes]
    log_path: Path
    _offset: int = field(default=0)

    def lines(self) -> list[dict[str, Any]]:
        parsed = []
        for raw in self.log_path.read_text(errors="replace").splitlines():
            try:
                parsed.append(json.loads(raw))
            except ValueError:
                parsed.append({"event": raw, "unparsed": True})
        return parsed

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def has(self, fragment: str) -> bool:
        return fragment in self.text()

    async def wait_log(self, fragment: str, within: float = 30.0) -> None:
        def seen() -> bool:
            if self.process.poll() is not None and fragment not in self.text():
                raise AssertionError(f"worker exited ({self.process.returncode}) before {fragment!r}:\n{self.text()}")
            return fragment in self.text()

        await wait_for(seen, within, f"{fragment!r} in the worker log")

    def signal(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)

    async def wait_exit(self, within: float = 30.0) -> int:
        try:
            await wait_for(lambda: self.process.poll() is not None, within, "the worker to exit")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; its log ends with:\n{self.text()[-4000:]}") from None
        return self.process.returncode


def _spawn(command: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


@pytest.fixture
def start_worker(settings_env: dict[str, str]) -> Iterator[Callable[..., Any]]:
    """Start worker processes on the test's database and Redis namespace; all are killed at the end."""
    started: list[WorkerProc] = []
    log_dir = Path(tempfile.mkdtemp(prefix="queue-worker-logs-"))

    async def start(*args: str, wait: str | None = "Worker serving", **env: str) -> WorkerProc:
        log_path = log_dir / f"worker-{len(started)}.log"
        full_env = {
            "PATH": os.environ["PATH"],
            "HOME": os.environ.get("HOME", "/tmp"),
            "PYTHONUNBUFFERED": "1",
            **settings_env,
            "LOG_FORMAT": "json",
            "WORKER_SHUTDOWN_GRACE_SECONDS": "10",
            **env,
        }
        command = [sys.executable, "-m", "app.worker", "--module", SAMPLE_MODULE, "--queues", "default-queue", *args]
        worker = WorkerProc(_spawn(command, full_env, log_path), log_path)
        started.append(worker)
        if wait:
            await worker.wait_log(wait)
        return worker

    yield start
    for worker in started:
        if worker.process.poll() is None:
            worker.process.kill()
            worker.process.wait(10)
    shutil.rmtree(log_dir, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_server_binary() -> str:
    bundled = Path(sys.executable).parent / "redis-server"
    if bundled.exists():
        return str(bundled)
    found = shutil.which("redis-server")
    if not found:
        pytest.skip("no redis-server binary")
    return found


@dataclass
class PrivateRedis:
    """A redis-server of this test only, on a free port: the fault tests stop and restart it."""

    port: int
    extra: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        command = [
            redis_server_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            *self.extra,
        ]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("private redis-server did not start")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        self.process = None


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    server = PrivateRedis(free_port(), extra=("--maxmemory-policy", "allkeys-lru"))
    server.start()
    yield server
    server.kill()
