"""A soak process: started, signalled, restarted (each start appended to its log) and stopped.

Every process starts in its own session, so a signal meant for it reaches nobody
else; its output goes to a log file in the run folder.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from app.testing.processes import child_env

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Proc:
    """One role's process (``api-1``, ``worker-2``...), restartable: each start appends to its log."""

    name: str
    command: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self, env: Mapping[str, str], *, stdin: int | None = None, stdout: int | None = None) -> None:
        with self.log.open("ab") as out:
            out.write(f"\n==== start {self.starts + 1} at {time.strftime('%H:%M:%S')} ====\n".encode())
            out.flush()
            self.process = subprocess.Popen(
                self.command,
                cwd=ROOT,
                env=child_env(env),
                stdin=stdin if stdin is not None else subprocess.DEVNULL,
                stdout=stdout if stdout is not None else out,
                stderr=out,
                start_new_session=True,
            )
        self.starts += 1

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.alive:
            assert self.process is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, sig)

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None if still running after ``timeout``."""
        if self.process is None:
            return None
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 15.0) -> None:
        if not self.alive:
            return
        self.signal(signal.SIGTERM)
        if self.wait(timeout) is None:
            self.signal(signal.SIGKILL)
            self.wait(5.0)

    def log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-chars:]
        return ""


def read_ready(stream: IO[bytes] | None, proc: Proc, timeout: float = 60.0, word: str = "ready") -> str:
    """What follows ``word`` on the line a stub prints once it serves (``ready <url>``) or waits (``waiting``)."""
    assert stream is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = stream.readline().decode().strip()
        if line.split(" ", 1)[0] == word:
            return line.partition(" ")[2]
        if not line and not proc.alive:
            break
    raise RuntimeError(f"{proc.name} did not start: see {proc.log}\n{proc.log_tail()}")
