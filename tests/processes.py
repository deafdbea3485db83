"""Real API processes for tests: started on a free port, stopped (or killed) for real."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_env(env: Mapping[str, str]) -> dict[str, str]:
    """The test's settings on top of a minimal environment (no developer settings leak in)."""
    base = {key: os.environ[key] for key in ("PATH", "HOME", "LANG") if key in os.environ}
    return {**base, "PYTHONUNBUFFERED": "1", **env}


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


def stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode
