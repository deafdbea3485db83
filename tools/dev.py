"""`make dev`: the API and the worker together, on embedded Postgres and Redis unless URLs are given.

    python -m tools.dev          (HOST, PORT choose where the API listens: 127.0.0.1, 8000)

Steps, one line each: load or generate `.data/dev-secrets.env` (with the generated Stripe key, the Stripe
API is the local stub `make stripe-stub` serves); start embedded Postgres and Redis for
whichever of DATABASE_URL / REDIS_URL is unset; run the migrations; start the API and the worker,
each in its own process group; with OPS_PASSWORD set, print the operations page's URL. SIGINT, SIGTERM or
SIGHUP is forwarded to both; whatever still runs after GRACE_SECONDS is killed; then the embedded servers
this run started are stopped (their data stays in `.data/`). Servers that were running already (started by
`make cli`, `make migrate`, ...) are left running, as they were found.
If the API or the worker exits by itself, the other is stopped too and the exit status is 1.

Overrides, mainly for tests: DEV_API_CMD, DEV_WORKER_CMD (argv, split like a shell would),
DEV_MIGRATE_CMD (a shell command), DEV_DATA_DIR (instead of `.data/`).
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit

import psutil

from tools import embedded

ROOT = Path(__file__).resolve().parent.parent
GRACE_SECONDS = 10.0
SECRETS_FILE = "dev-secrets.env"
OWNER_FILE = "dev-supervisor.pid"
DEV_STRIPE_API_KEY = "sk_test_dev"
"""The generated Stripe key: no Stripe account is behind it."""
STRIPE_STUB_PORT = 12111
"""Where `make stripe-stub` (``tools.dev_stripe``) serves the local Stripe API."""


class _Stop(Exception):
    """Raised by the signal handler so that any step, even a slow start-up, unwinds into clean-up."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _say(line: str) -> None:
    print(line, flush=True)


def _whsec() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def load_dev_secrets(path: Path) -> None:
    """Put the development secrets into os.environ, generating the file once: the same secrets on every
    run, so test-webhook commands signed with them keep working. Values already set in the
    environment win over the file."""
    values: dict[str, str] = {}
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and not key.lstrip().startswith("#"):
                values[key.strip()] = value.strip()
    wanted = {
        "STRIPE_WEBHOOK_SECRET": _whsec,
        "CLERK_WEBHOOK_SIGNING_SECRET": _whsec,
        "STRIPE_API_KEY": lambda: DEV_STRIPE_API_KEY,
    }
    missing = {key: make() for key, make in wanted.items() if key not in values}
    if missing:
        values.update(missing)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write("# Development-only secrets from `make dev`: never use them in production.\n")
            handle.writelines(f"{key}={value}\n" for key, value in values.items())
    for key, value in values.items():
        os.environ.setdefault(key, value)
    _say(f"Secrets: {'generated into' if missing else 'loaded from'} {path.name} in {path.parent.name}/")


def use_local_stripe() -> str | None:
    """With the generated key, the Stripe API is the local stub (`make stripe-stub`), not Stripe's own, which
    would refuse the key: returns its URL, or None when STRIPE_API_KEY or STRIPE_API_BASE was given."""
    if os.environ.get("STRIPE_API_KEY") != DEV_STRIPE_API_KEY or os.environ.get("STRIPE_API_BASE"):
        return None
    os.environ["STRIPE_API_BASE"] = f"http://127.0.0.1:{STRIPE_STUB_PORT}"
    return os.environ["STRIPE_API_BASE"]


def _recorded_owner(data_dir: Path) -> tuple[int | None, bool]:
    """The pid the owner file names (None: no file), and whether it is a live `make dev` supervisor."""
    try:
        pid = int((data_dir / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None, False
    try:
        return pid, "tools.dev" in psutil.Process(pid).cmdline()
    except psutil.Error:
        return pid, False


def _claim(data_dir: Path) -> int | None:
    """Become the owner of the embedded servers, unless another live `make dev` is: a second
    supervisor sharing `.data/` must not stop the servers under the first one. Returns that
    other supervisor's pid, or None when we own them (including those a killed run left behind)."""
    other, alive = _recorded_owner(data_dir)
    if alive and other != os.getpid():
        return other
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / OWNER_FILE).write_text(str(os.getpid()))
    return None


SERVICES = {
    "Postgres": ("DATABASE_URL", embedded.ensure_postgres),
    "Redis": ("REDIS_URL", embedded.ensure_redis),
}
RUNNING: dict[str, Callable[[Path], int | None]] = {
    "Postgres": lambda data_dir: embedded._running_postgres(data_dir.resolve() / "postgres"),
    "Redis": lambda data_dir: embedded._running_redis(data_dir.resolve() / "redis"),
}
"""The port of each embedded server of a data folder when it runs already, else None."""


def _provide_services(data_dir: Path, wanted: list[str], shared_with: int | None, found: list[str]) -> None:
    """Point each unset URL (`wanted`) at an embedded server; report every service either way.
    `found`: the embedded servers that were running before this run, which it leaves running."""
    for label, (var, ensure) in SERVICES.items():
        if label not in wanted:
            where = urlsplit(os.environ[var])  # host and port only: the URL may hold a password
            _say(f"{label}: using {var} ({where.hostname}:{where.port or 'default port'})")
            continue
        os.environ[var] = ensure(data_dir)
        if shared_with:
            note = f" (shared with make dev pid {shared_with}, which stops it)"
        elif label in found:
            note = " (running already: left running at exit)"
        else:
            note = ""
        _say(f"{label}: embedded at {os.environ[var]}{note}")


def _spawn(argv: list[str] | str, shell: bool = False) -> subprocess.Popen[bytes]:
    # A session of its own: a terminal's Ctrl-C reaches only us, and we decide the order of stopping.
    return subprocess.Popen(argv, cwd=ROOT, shell=shell, stdin=subprocess.DEVNULL, start_new_session=True)


def _killpg(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _stop_children(children: dict[str, subprocess.Popen[bytes]], sig: int) -> None:
    """Forward `sig` to each child's process group, then SIGKILL the groups after the grace period:
    a stuck job must not keep `make dev` from exiting, and grandchildren must not outlive us."""
    for proc in children.values():
        _killpg(proc, sig)
    deadline = time.monotonic() + GRACE_SECONDS
    for name, proc in children.items():
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _say(f"{name}: still running after {GRACE_SECONDS:.0f}s, killing it")
        _killpg(proc, signal.SIGKILL)
        proc.wait()


def _venv_tool(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def _migrate(children: dict[str, subprocess.Popen[bytes]]) -> None:
    custom = os.environ.get("DEV_MIGRATE_CMD")
    _say("Migrations: running")
    children["Migrations"] = proc = (
        _spawn(custom, shell=True)
        if custom
        else _spawn([_venv_tool("litestar"), "--app", "app.asgi:create_app", "database", "upgrade", "--no-prompt"])
    )
    code = proc.wait()
    del children["Migrations"]
    if code:
        raise RuntimeError(f"migrations failed (exit {code}); fix them, then run `make dev` again")
    _say("Migrations: done")


def _start_app(children: dict[str, subprocess.Popen[bytes]]) -> None:
    host, port = os.environ.get("HOST", "127.0.0.1"), os.environ.get("PORT", "8000")
    api = os.environ.get("DEV_API_CMD")
    worker = os.environ.get("DEV_WORKER_CMD")
    children["API"] = _spawn(
        shlex.split(api)
        if api
        else [
            _venv_tool("uvicorn"),
            "--factory",
            "app.asgi:create_app",
            "--host",
            host,
            "--port",
            port,
            "--no-proxy-headers",
        ]
    )
    _say(f"API: http://{host}:{port}")
    if os.environ.get("OPS_PASSWORD"):
        _say(f"Operations page: http://{host}:{port}/ops (log in with OPS_PASSWORD)")
    children["Worker"] = _spawn(shlex.split(worker) if worker else [sys.executable, "-m", "app.worker"])
    _say("Worker: started")


def _supervise(children: dict[str, subprocess.Popen[bytes]]) -> int:
    """Wait until a signal arrives (raised as _Stop) or a child exits, which is always unexpected."""
    while True:
        for name, proc in children.items():
            if proc.poll() is not None:
                _say(f"{name}: exited unexpectedly (exit {proc.returncode}); stopping the rest")
                return 1
        time.sleep(0.2)


def _raise_stop(signum: int, _frame: FrameType | None) -> None:
    raise _Stop(signum)


def _handle_signals(handler: Callable[[int, FrameType | None], None] | signal.Handlers) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def main() -> int:
    data_dir = Path(os.environ.get("DEV_DATA_DIR") or ROOT / ".data").resolve()
    children: dict[str, subprocess.Popen[bytes]] = {}
    to_stop: list[str] = []
    found: list[str] = []
    owner = False
    forward, code = signal.SIGTERM, 1
    _handle_signals(_raise_stop)
    try:
        load_dev_secrets(data_dir / SECRETS_FILE)
        if stub := use_local_stripe():
            _say(f"Stripe API: the local stub at {stub} (`make stripe-stub`; a real STRIPE_API_KEY uses Stripe's)")
        os.environ.setdefault("APP_ENV", "development")
        wanted = [label for label, (var, _) in SERVICES.items() if not os.environ.get(var)]
        # Servers running already were started by another command (`make cli`...), which leaves them running:
        # so does this run. Unless a killed `make dev` left them (its owner file remains): they are ours to stop.
        left_by_killed_run = _recorded_owner(data_dir)[0] is not None
        # Claimed before starting anything, so that a Ctrl-C during start-up still stops what started.
        shared_with = _claim(data_dir) if wanted else None
        found = [] if left_by_killed_run else [label for label in wanted if RUNNING[label](data_dir)]
        to_stop = [] if shared_with else [label for label in wanted if label not in found]
        owner = bool(wanted) and not shared_with
        _provide_services(data_dir, wanted, shared_with, found)
        _migrate(children)
        _start_app(children)
        code = _supervise(children)
    except _Stop as stop:
        _say(f"Stopping ({stop})")
        forward = signal.SIGINT if stop.signum == signal.SIGINT else signal.SIGTERM
        code = 0
    except Exception as error:  # one clear line instead of a traceback, then clean up as usual
        _say(f"make dev: {error}")
    finally:
        _handle_signals(signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        _stop_children(children, forward)
        if to_stop:
            stopped = embedded.stop_all(data_dir, to_stop)
            _say(f"{' and '.join(stopped) or 'Embedded servers'}: stopped (data kept in {data_dir.name}/)")
        if owner and found:
            left = " and ".join(found)
            _say(f"{left}: left running, as before make dev (`.venv/bin/python -m tools.embedded down` stops it)")
        if owner:
            (data_dir / OWNER_FILE).unlink(missing_ok=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
