"""`make dev`: the API and the worker together, on embedded Postgres and Redis unless URLs are given.

    python -m tools.dev          (HOST, PORT choose where the API listens: 127.0.0.1, 8000)

Steps, one line each: load or generate `.data/dev-secrets.env` (with the generated Stripe key, the Stripe
API is the local stub `make stripe-stub` serves); start embedded Postgres and Redis for
whichever of DATABASE_URL / REDIS_URL is unset; run the migrations; start the API and the worker,
each in its own process group. SIGINT, SIGTERM or SIGHUP is forwarded to both; whatever still runs
after GRACE_SECONDS is killed; then the embedded servers are stopped (their data stays in `.data/`).
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


def _claim(data_dir: Path) -> int | None:
    """Become the owner of the embedded servers, unless another live `make dev` is: a second
    supervisor sharing `.data/` must not stop the servers under the first one. Returns that
    other supervisor's pid, or None when we own them (including those a killed run left behind)."""
    owner_file = data_dir / OWNER_FILE
    with contextlib.suppress(OSError, ValueError, psutil.Error):
        other = int(owner_file.read_text())
        if other != os.getpid() and "tools.dev" in " ".join(psutil.Process(other).cmdline()):
            return other
    data_dir.mkdir(parents=True, exist_ok=True)
    owner_file.write_text(str(os.getpid()))
    return None


SERVICES = {
    "Postgres": ("DATABASE_URL", embedded.ensure_postgres),
    "Redis": ("REDIS_URL", embedded.ensure_redis),
}


def _provide_services(data_dir: Path, wanted: list[str], shared_with: int | None) -> None:
    """Point each unset URL (`wanted`) at an embedded server; report every service either way."""
    for label, (var, ensure) in SERVICES.items():
        if label not in wanted:
            where = urlsplit(os.environ[var])  # host and port only: the URL may hold a password
            _say(f"{label}: using {var} ({where.hostname}:{where.port or 'default port'})")
            continue
        os.environ[var] = ensure(data_dir)
        note = f" (shared with make dev pid {shared_with}, which stops it)" if shared_with else ""
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
    forward, code = signal.SIGTERM, 1
    _handle_signals(_raise_stop)
    try:
        load_dev_secrets(data_dir / SECRETS_FILE)
        if stub := use_local_stripe():
            _say(f"Stripe API: the local stub at {stub} (`make stripe-stub`; a real STRIPE_API_KEY uses Stripe's)")
        os.environ.setdefault("APP_ENV", "development")
        wanted = [label for label, (var, _) in SERVICES.items() if not os.environ.get(var)]
        # Claimed before starting anything, so that a Ctrl-C during start-up still stops what started.
        shared_with = _claim(data_dir) if wanted else None
        to_stop = [] if shared_with else wanted
        _provide_services(data_dir, wanted, shared_with)
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
            (data_dir / OWNER_FILE).unlink(missing_ok=True)
            _say(f"{' and '.join(stopped) or 'Embedded servers'}: stopped (data kept in {data_dir.name}/)")
    return code


if __name__ == "__main__":
    sys.exit(main())
