"""Real API processes for tests: started on a free port, stopped (or killed) for real."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from app.testing.processes import child_env, free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def wait_until_healthy(base_url: str, process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"API process exited with {process.returncode} before answering")
        try:
            if httpx.get(f"{base_url}/health", timeout=0.5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"API at {base_url} did not answer /health within {timeout}s")


@contextmanager
def api_process(env: Mapping[str, str]) -> Iterator[str]:
    """One uvicorn process serving the app; yields its base URL."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            "app.asgi:create_app",
            "--port",
            str(port),
            "--no-access-log",
            "--no-proxy-headers",
        ],
        cwd=ROOT,
        env=child_env(env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(base_url, process)
        yield base_url
    finally:
        stop(process)


@contextmanager
def logged_api_process(env: Mapping[str, str], log_path: Path, factory: str = "app.asgi:create_app") -> Iterator[str]:
    """``api_process`` with the API's output (access log included) written to ``log_path``; ``factory``: the app."""
    port = free_port()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--factory",
                factory,
                "--port",
                str(port),
                "--no-proxy-headers",
            ],
            cwd=ROOT,
            env=child_env(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(base_url, process)
        yield base_url
    finally:
        stop(process)


def stop(process: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def embedded_servers_folder(prefix: str) -> Path:
    """A new folder for embedded servers' data, outside pytest's base temp folder: as root, the embedded Postgres
    runs as another account, which needs o+x on each folder above its data, and every pytest session that starts
    (the guide test runs a suite of its own beside the suite) resets that base folder to 0700. The caller removes
    it."""
    return Path(tempfile.mkdtemp(prefix=prefix))


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


def _spawn_logged(command: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


@asynccontextmanager
async def worker_starter(settings_env: Mapping[str, str], *default_args: str) -> AsyncIterator[Callable[..., Any]]:
    """Start worker processes on the test's database and Redis namespace; all are killed at the end."""
    started: list[WorkerProc] = []
    log_dir = Path(tempfile.mkdtemp(prefix="worker-logs-"))

    async def start(*args: str, wait: str | None = "Worker serving", **env: str) -> WorkerProc:
        log_path = log_dir / f"worker-{len(started)}.log"
        defaults = {"LOG_FORMAT": "json", "WORKER_SHUTDOWN_GRACE_SECONDS": "10", "WORKER_METRICS_PORT": "0"}
        full_env = child_env({**settings_env, **defaults, **env})
        command = [sys.executable, "-m", "app.testing.worker", *default_args, *args]
        worker = WorkerProc(_spawn_logged(command, full_env, log_path), log_path)
        started.append(worker)
        if wait:
            await worker.wait_log(wait)
        return worker

    try:
        yield start
    finally:
        for worker in started:
            if worker.process.poll() is None:
                worker.process.kill()
                worker.process.wait(10)
        shutil.rmtree(log_dir, ignore_errors=True)
