"""The bench's own API, ceiling and worker processes: real subprocesses, always stopped at the end.

Every process starts in its own session (a Ctrl-C in the terminal reaches only
the harness, which stops them in order), writes its output to a log file in
the run's directory, and is watched for its peak RSS (``VmHWM``, and psutil
samples as a fallback).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from app.testing.processes import child_env, free_port

ROOT = Path(__file__).resolve().parents[1]
UVICORN_FLAGS = ["--host", "127.0.0.1", "--no-access-log", "--no-proxy-headers"]


@dataclass
class Managed:
    role: str  # "api", "ceiling", "worker"
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    peak_rss: int = 0
    metrics_url: str | None = None  # a worker's own /metrics

    def pids(self) -> list[int]:
        try:
            parent = psutil.Process(self.process.pid)
            return [self.process.pid, *(child.pid for child in parent.children(recursive=True))]
        except psutil.Error:
            return []


def _hwm(pid: int) -> int:
    """Peak resident set size of a live process (Linux ``VmHWM``), 0 if unknown."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass
class Processes:
    """Starts, watches and stops the bench's processes."""

    directory: Path
    running: list[Managed] = field(default_factory=list)
    stopped: list[Managed] = field(default_factory=list)
    _monitor: threading.Thread | None = None
    _stop_monitor: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, role: str, name: str, command: list[str], env: Mapping[str, str]) -> Managed:
        log = self.directory / f"{name}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                command, cwd=ROOT, env=child_env(env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        managed = Managed(role, name, process, log)
        with self._lock:
            self.running.append(managed)
        self._ensure_monitor()
        return managed

    def start_uvicorn(
        self,
        role: str,
        name: str,
        factory: str,
        env: Mapping[str, str],
        workers: int,
        launcher: Sequence[str] = (),
    ) -> tuple[str, Managed]:
        """``launcher``: ``python -m`` arguments run first (``bench.without_metrics``), uvicorn then runs under it."""
        port = free_port()
        run_uvicorn = [*launcher, "uvicorn"] if launcher else ["-m", "uvicorn"]
        command = [sys.executable, *run_uvicorn, "--factory", factory, "--port", str(port), *UVICORN_FLAGS]
        if workers > 1:
            command += ["--workers", str(workers)]
        managed = self.start(role, name, command, env)
        base_url = f"http://127.0.0.1:{port}"
        self._wait_listening(managed, base_url)
        return base_url, managed

    def start_worker(
        self,
        name: str,
        env: Mapping[str, str],
        extra: list[str],
        launcher: Sequence[str] = (),
        queues: Sequence[str] | None = None,
    ) -> Managed:
        """``queues``: the ones it serves (``--queues``); None: every queue of the modules it loads."""
        run_worker = [*launcher, "app.testing.worker"] if launcher else ["-m", "app.testing.worker"]
        served = ["--queues", ",".join(queues)] if queues else []
        command = [sys.executable, *run_worker, *served, *extra]
        return self.start("worker", name, command, env)

    def _wait_listening(self, managed: Managed, base_url: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if managed.process.poll() is not None:
                raise RuntimeError(f"{managed.name} exited with {managed.process.returncode}: see {managed.log}")
            try:
                # Any answer means the server is up (the ceiling has no /health).
                httpx.get(f"{base_url}/health", timeout=0.5)
                return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise TimeoutError(f"{managed.name} did not listen at {base_url} within {timeout:g} s: see {managed.log}")

    def _ensure_monitor(self) -> None:
        if self._monitor is None:
            self._monitor = threading.Thread(target=self._watch, name="rss monitor", daemon=True)
            self._monitor.start()

    def _sample(self, managed: Managed) -> None:
        for pid in managed.pids():
            try:
                rss = max(psutil.Process(pid).memory_info().rss, _hwm(pid))
            except psutil.Error:
                continue
            managed.peak_rss = max(managed.peak_rss, rss)

    def _watch(self) -> None:
        while not self._stop_monitor.wait(0.25):
            with self._lock:
                current = list(self.running)
            for managed in current:
                self._sample(managed)

    def stop(self, managed: Managed, timeout: float = 10.0) -> None:
        self._sample(managed)
        process = managed.process
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        with self._lock:
            if managed in self.running:
                self.running.remove(managed)
                self.stopped.append(managed)

    def stop_all(self) -> None:
        for managed in reversed(list(self.running)):
            self.stop(managed)
        self._stop_monitor.set()

    def peak_rss_mb(self, role: str) -> float:
        with self._lock:
            everyone = [*self.running, *self.stopped]
        peaks = [managed.peak_rss for managed in everyone if managed.role == role]
        return max(peaks) / 2**20 if peaks else float("nan")
