"""Embedded Postgres and Redis, and the `make dev` supervisor, as real processes in a temporary folder."""

from __future__ import annotations

import asyncio
import os
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import asyncpg
import psutil
import pytest
import redis

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `tools` is not an installed package: it runs from the checkout
    sys.path.insert(0, str(ROOT))

from tests.processes import embedded_servers_folder  # noqa: E402
from tools import dev, embedded, test_env  # noqa: E402


@pytest.fixture(scope="module")
def data_dir() -> Iterator[Path]:
    """One cluster for the module: initdb runs once, later tests start it warm."""
    path = embedded_servers_folder("embedded-")
    yield path
    embedded.stop_all(path)
    shutil.rmtree(path, ignore_errors=True)


def _free_port() -> int:
    port = embedded._bind(0)
    assert port
    return port


def _server_pids(data_dir: Path) -> list[int]:
    """The postmaster, its backends and helpers, and redis-server."""
    postmaster = int((data_dir / "postgres" / "postmaster.pid").read_text().split()[0])
    children = [child.pid for child in psutil.Process(postmaster).children(recursive=True)]
    redis_pid = int((data_dir / "redis" / "redis.pid").read_text())
    return [postmaster, *children, redis_pid]


def _running(pids: list[int]) -> list[int]:
    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    return [pid for pid in pids if alive(pid)]


def _wait_until(check: Callable[[], bool], proc: subprocess.Popen[str] | None = None) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert (proc is None or proc.poll() is None) and time.monotonic() < deadline
        time.sleep(0.05)


async def _query(url: str, sql: str) -> object:
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg", "postgresql"))
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


def test_postgres_answers_on_loopback_with_the_app_database(data_dir: Path) -> None:
    embedded.stop_all(data_dir)
    port = _free_port()
    url = embedded.ensure_postgres(data_dir, port)
    assert url == f"postgresql+asyncpg://postgres@127.0.0.1:{port}/app"
    assert asyncio.run(_query(url, "SELECT 1")) == 1
    assert asyncio.run(_query(url, "SELECT current_database()")) == "app"
    assert asyncio.run(_query(url, "SHOW listen_addresses")) == "127.0.0.1"


def test_redis_answers_with_noeviction_and_an_append_only_file(data_dir: Path) -> None:
    embedded.stop_all(data_dir)
    port = _free_port()
    url = embedded.ensure_redis(data_dir, port)
    assert url == f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    try:
        assert client.ping()
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("bind") == {"bind": "127.0.0.1"}
    finally:
        client.close()


def test_second_ensure_reuses_the_running_instances(data_dir: Path) -> None:
    first = embedded.ensure_postgres(data_dir), embedded.ensure_redis(data_dir)
    pids = _server_pids(data_dir)[:1] + _server_pids(data_dir)[-1:]
    again = embedded.ensure_postgres(data_dir, _free_port()), embedded.ensure_redis(data_dir, _free_port())
    assert again == first
    assert _server_pids(data_dir)[:1] + _server_pids(data_dir)[-1:] == pids


def test_stop_all_leaves_no_process_and_a_restart_keeps_data_and_ports(data_dir: Path) -> None:
    db_url, redis_url = embedded.ensure_postgres(data_dir), embedded.ensure_redis(data_dir)
    asyncio.run(_query(db_url, "CREATE TABLE IF NOT EXISTS kept (id int)"))
    pids = _server_pids(data_dir)

    assert embedded.stop_all(data_dir) == ["Postgres", "Redis"]
    assert _running(pids) == []
    assert embedded.stop_all(data_dir) == []

    assert (embedded.ensure_postgres(data_dir), embedded.ensure_redis(data_dir)) == (db_url, redis_url)
    assert asyncio.run(_query(db_url, "SELECT count(*) FROM kept")) == 0


def test_ensure_restarts_servers_that_were_killed(data_dir: Path) -> None:
    urls = embedded.ensure_postgres(data_dir), embedded.ensure_redis(data_dir)
    pids = _server_pids(data_dir)
    for pid in (pids[0], pids[-1]):
        os.kill(pid, signal.SIGKILL)
    _wait_until(lambda: _running(pids) == [])

    assert (embedded.ensure_postgres(data_dir), embedded.ensure_redis(data_dir)) == urls
    assert asyncio.run(_query(urls[0], "SELECT 1")) == 1


def test_test_env_falls_back_to_embedded_servers(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TEST_DATABASE_URL", "TEST_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(test_env, "LOCAL_PG_PORT", _free_port())
    monkeypatch.setattr(test_env, "LOCAL_REDIS_PORT", _free_port())
    monkeypatch.setattr(test_env, "TEST_DATA_DIR", data_dir)
    db_url = test_env.database_url()
    assert db_url.endswith("/test")
    assert asyncio.run(_query(db_url, "SELECT current_database()")) == "test"
    assert test_env.redis_url() == embedded.ensure_redis(data_dir)


def test_dev_secrets_are_generated_once_and_the_environment_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = ("STRIPE_WEBHOOK_SECRET", "CLERK_WEBHOOK_SIGNING_SECRET", "STRIPE_API_KEY")
    for name in names:
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "dev-secrets.env"
    dev.load_dev_secrets(path)
    first = {name: os.environ[name] for name in names}
    assert first["STRIPE_WEBHOOK_SECRET"].startswith("whsec_")
    assert path.stat().st_mode & 0o077 == 0

    monkeypatch.setenv("STRIPE_API_KEY", "sk_test_mine")
    monkeypatch.delenv("STRIPE_WEBHOOK_SECRET")
    dev.load_dev_secrets(path)
    assert os.environ["STRIPE_WEBHOOK_SECRET"] == first["STRIPE_WEBHOOK_SECRET"]
    assert os.environ["STRIPE_API_KEY"] == "sk_test_mine"


def _sleeper(pidfile: Path) -> str:
    # Written aside, then renamed: a reader that sees the file sees the whole pid (the file could be empty else).
    code = f"import os, pathlib, time; pathlib.Path({str(pidfile)!r} + '.tmp').write_text(str(os.getpid()))"
    code += f"; os.replace({str(pidfile)!r} + '.tmp', {str(pidfile)!r}); time.sleep(300)"
    return shlex.join([sys.executable, "-c", code])


def _start_dev(data_dir: Path, api: str, worker: str, **extra: str) -> tuple[subprocess.Popen[str], queue.Queue[str]]:
    """`python -m tools.dev` in its own session, as `make dev` runs it, with its output in a queue."""
    unset = ("DATABASE_URL", "REDIS_URL", "OPS_PASSWORD")
    env = {key: value for key, value in os.environ.items() if key not in unset}
    env.update(DEV_DATA_DIR=str(data_dir), DEV_MIGRATE_CMD="true", DEV_API_CMD=api, DEV_WORKER_CMD=worker, **extra)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.dev"],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump(stream: IO[str]) -> None:
        for line in stream:
            lines.put(line)

    assert proc.stdout is not None
    threading.Thread(target=pump, args=(proc.stdout,), daemon=True).start()
    return proc, lines


def _wait_for_line(lines: queue.Queue[str], prefix: str) -> list[str]:
    seen: list[str] = []
    while not any(line.startswith(prefix) for line in seen):
        try:
            seen.append(lines.get(timeout=60))
        except queue.Empty:
            pytest.fail(f"no line starting with {prefix!r}; got {seen}")
    return seen


def test_dev_stops_the_api_the_worker_and_the_servers_on_sigterm(data_dir: Path, tmp_path: Path) -> None:
    embedded.stop_all(data_dir)  # none runs before: this run starts both, so it stops both
    api_pid, worker_pid = tmp_path / "api.pid", tmp_path / "worker.pid"
    proc, lines = _start_dev(data_dir, _sleeper(api_pid), _sleeper(worker_pid), OPS_PASSWORD="a-long-one")
    started = _wait_for_line(lines, "API: http://127.0.0.1:8000")
    started += _wait_for_line(lines, "Worker:")
    assert "Operations page: http://127.0.0.1:8000/ops (log in with OPS_PASSWORD)\n" in started
    _wait_until(lambda: api_pid.exists() and worker_pid.exists(), proc)
    pids = [int(api_pid.read_text()), int(worker_pid.read_text()), *_server_pids(data_dir)]

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert _running(pids) == []
    assert not (data_dir / dev.OWNER_FILE).exists()


def test_dev_leaves_running_the_servers_an_earlier_command_started(data_dir: Path, tmp_path: Path) -> None:
    embedded.ensure_postgres(data_dir)  # as `make cli` leaves them
    embedded.ensure_redis(data_dir)
    servers = _server_pids(data_dir)
    api_pid, worker_pid = tmp_path / "api.pid", tmp_path / "worker.pid"
    proc, lines = _start_dev(data_dir, _sleeper(api_pid), _sleeper(worker_pid))
    started = _wait_for_line(lines, "Worker:")
    assert not any(line.startswith("Operations page:") for line in started)  # OPS_PASSWORD unset: no page
    assert any(line.startswith("Postgres: embedded at ") and "left running at exit" in line for line in started)
    _wait_until(lambda: api_pid.exists() and worker_pid.exists(), proc)
    children = [int(api_pid.read_text()), int(worker_pid.read_text())]

    proc.send_signal(signal.SIGINT)  # Ctrl-C
    assert proc.wait(timeout=30) == 0
    output = _wait_for_line(lines, "Postgres and Redis: left running")
    assert not any("stopped" in line for line in output)
    assert _running(children) == []
    assert _running([servers[0], servers[-1]]) == [servers[0], servers[-1]]  # the postmaster and redis-server
    assert not (data_dir / dev.OWNER_FILE).exists()


def test_dev_stops_the_servers_a_killed_run_left_behind(data_dir: Path, tmp_path: Path) -> None:
    embedded.ensure_postgres(data_dir)
    embedded.ensure_redis(data_dir)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (data_dir / dev.OWNER_FILE).write_text(gone.stdout.strip())  # a `make dev` killed before it cleaned up
    api_pid, worker_pid = tmp_path / "api.pid", tmp_path / "worker.pid"
    proc, lines = _start_dev(data_dir, _sleeper(api_pid), _sleeper(worker_pid))
    _wait_for_line(lines, "Worker:")
    _wait_until(lambda: api_pid.exists() and worker_pid.exists(), proc)
    pids = [int(api_pid.read_text()), int(worker_pid.read_text()), *_server_pids(data_dir)]

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    _wait_for_line(lines, "Postgres and Redis: stopped")
    assert _running(pids) == []


def test_dev_stops_everything_and_fails_when_a_child_exits(data_dir: Path, tmp_path: Path) -> None:
    embedded.stop_all(data_dir)
    api_pid = tmp_path / "api.pid"
    worker = shlex.join([sys.executable, "-c", "import time, sys; time.sleep(1); sys.exit(3)"])
    proc, lines = _start_dev(data_dir, _sleeper(api_pid), worker)
    _wait_for_line(lines, "API: ")
    _wait_until(api_pid.exists, proc)
    pids = [int(api_pid.read_text()), *_server_pids(data_dir)]

    assert proc.wait(timeout=30) == 1
    output = _wait_for_line(lines, "Postgres and Redis: stopped")
    assert any(line.startswith("Worker: exited unexpectedly (exit 3)") for line in output)
    assert _running(pids) == []


def _dev_env(data_dir: Path) -> subprocess.CompletedProcess[str]:
    """`python -m tools.dev_env -- true`, as `make migrate` and `make cli` run their command, on `data_dir`."""
    env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "REDIS_URL")}
    command = [sys.executable, "-m", "tools.dev_env", "--", "true"]
    done = subprocess.run(command, cwd=ROOT, env={**env, "DEV_DATA_DIR": str(data_dir)}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done


def test_make_migrate_and_make_cli_say_which_servers_they_started_and_left_running(data_dir: Path) -> None:
    embedded.stop_all(data_dir)
    first = _dev_env(data_dir).stderr.splitlines()
    pids = _server_pids(data_dir)
    again = _dev_env(data_dir).stderr.splitlines()

    ports = embedded._running_postgres(data_dir / "postgres"), embedded._running_redis(data_dir / "redis")
    stop = "left running: `.venv/bin/python -m tools.embedded down` stops it)."
    assert first[-2:] == [
        f"Postgres: embedded at 127.0.0.1:{ports[0]} (started now, {stop}",
        f"Redis: embedded at 127.0.0.1:{ports[1]} (started now, {stop}",
    ]
    assert again == [line.replace("started now", "running already") for line in first[-2:]]
    assert _running([pids[0], pids[-1]]) == [pids[0], pids[-1]]  # the postmaster and redis-server, left running
