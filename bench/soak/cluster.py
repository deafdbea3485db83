"""The soak's own servers and processes, and the faults it does to them.

Embedded Postgres and Redis on their own ports and data folder (so restarting
them touches nobody else), the Stripe, Clerk and Sentry stubs, two API processes
and two worker processes: real subprocesses (``proc.Proc``), each in its own
session, each logging to a file in the run folder. Everything here blocks; the
driver calls it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from app.testing.processes import child_env, free_port
from bench.soak.config import SoakConfig
from bench.soak.proc import ROOT, Proc, read_ready
from tools import embedded

WORKER_MODULE = "bench.soak.counters:MODULE"
REDIS_NAMESPACE = "soak:"
WORKER_READY_LINE = "Worker serving"
# The crons whose work the soak does itself after the sending phase (``outage.py``): 29 February, midnight UTC.
NEVER_RUNS = "0 0 29 2 *"

__all__ = ["ROOT", "Proc", "child_env", "free_port"]


@dataclass
class Cluster:
    config: SoakConfig
    run_dir: Path
    secrets: dict[str, str]
    data_dir: Path = field(init=False)
    database_url: str = ""
    redis_url: str = ""
    pg_port: int = 0
    redis_port: int = 0
    stripe_port: int = 0
    stripe_url: str = ""
    clerk_url: str = ""
    sentry_dsn: str = ""
    sentry_file: Path = field(init=False)
    apis: list[Proc] = field(default_factory=list)
    api_urls: list[str] = field(default_factory=list)
    workers: list[Proc] = field(default_factory=list)
    stripe: Proc | None = None
    stripe_next: Proc | None = None
    sentry: Proc | None = None
    clerk: Proc | None = None

    def __post_init__(self) -> None:
        self.data_dir = self.run_dir / "data"
        self.sentry_file = self.run_dir / "sentry-events.jsonl"

    # --- start -------------------------------------------------------------------------------------

    def start_servers(self) -> None:
        self.database_url = embedded.ensure_postgres(self.data_dir, None, database="soak", durable=True)
        self.pg_port = int(self.database_url.rsplit(":", 1)[1].split("/")[0])
        self.redis_url = embedded.ensure_redis(self.data_dir, None)
        self.redis_port = int(self.redis_url.rsplit(":", 1)[1].split("/")[0])

    def migrate(self) -> None:
        """Alembic to head, as ``make migrate`` does, then the handler-commit counter table."""
        command = [sys.executable, "-m", "bench.soak.migrate", self.database_url]
        done = subprocess.run(command, cwd=ROOT, env=child_env({}), capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise RuntimeError(f"migrations failed:\n{done.stdout}\n{done.stderr}")

    def start_stubs(self) -> None:
        """Sentry's, Stripe's and Clerk's; the Clerk stub imports while the others start."""
        command = [sys.executable, "-m", "app.testing.clerk_stub", "--port", "0"]
        self.clerk = Proc("clerk", command, self.run_dir / "clerk.log")
        self.clerk.start({}, stdout=subprocess.PIPE)
        self.sentry = Proc(
            "sentry",
            [sys.executable, "-m", "bench.soak.sentry_server", "--out", str(self.sentry_file)],
            self.run_dir / "sentry.log",
        )
        self.sentry.start({}, stdout=subprocess.PIPE)
        assert self.sentry.process is not None
        self.sentry_dsn = read_ready(self.sentry.process.stdout, self.sentry)
        self.stripe_port = free_port()
        self.stripe_url = f"http://127.0.0.1:{self.stripe_port}"
        self.spawn_stripe()
        state = self.run_dir / "stripe-state-0.json"
        state.write_text('{"objects": [], "faults": []}')
        self.serve_stripe(state)
        assert self.clerk.process is not None and self.clerk.process.stdout is not None
        self.clerk_url = self.clerk.process.stdout.readline().decode().strip()  # it prints its base URL
        if not self.clerk_url.startswith("http://"):
            raise RuntimeError(f"the Clerk stub did not start: see {self.clerk.log}\n{self.clerk.log_tail()}")

    def env(self) -> dict[str, str]:
        c = self.config
        return {
            "APP_ENV": "test",
            "DATABASE_URL": self.database_url,
            "REDIS_URL": self.redis_url,
            "REDIS_NAMESPACE": REDIS_NAMESPACE,
            "STRIPE_API_KEY": "sk_test_soak",
            "STRIPE_API_BASE": self.stripe_url,
            "STRIPE_API_TIMEOUT_SECONDS": str(c.stripe_timeout_seconds),
            "STRIPE_WEBHOOK_SECRET": self.secrets["stripe"],
            "CLERK_WEBHOOK_SIGNING_SECRET": self.secrets["clerk"],
            "CLERK_SECRET_KEY": "sk_test_soak",
            "CLERK_API_BASE": f"{self.clerk_url}/v1",
            "SENTRY_DSN": self.sentry_dsn,
            "WEBHOOK_RATE_LIMIT_PER_MINUTE": str(c.rate_limit),
            "TRUSTED_PROXIES": "127.0.0.1/32",
            "WEBHOOK_RETRY_LIMIT": str(c.retry_limit),
            "WEBHOOK_RETRY_BASE_SECONDS": str(c.retry_base_seconds),
            "WEBHOOK_JOB_TIMEOUT_SECONDS": str(c.job_timeout_seconds),
            "WEBHOOK_RECOVERY_CRON": "* * * * *",
            "WEBHOOK_BACKFILL_CRON": NEVER_RUNS,
            "BILLING_RECONCILE_CRON": NEVER_RUNS,
            "IDENTITY_RECONCILE_CRON": NEVER_RUNS,
            "WEBHOOK_RECOVERY_AFTER_SECONDS": str(c.recovery_after_seconds),
            "WEBHOOK_ABANDON_AFTER_ATTEMPTS": str(c.abandon_after_attempts),
            "UPSTREAM_PROBE_SECONDS": str(c.upstream_probe_seconds),
            "FREE_PLAN_MEMBER_LIMIT": str(c.free_plan_member_limit),
            "WORKER_SHUTDOWN_GRACE_SECONDS": str(c.shutdown_grace_seconds),
            "WORKER_MAX_JOBS": str(c.worker_max_jobs),
            "LOG_FORMAT": "json",
            "LOG_LEVEL": c.log_level,
        }

    def start_apps(self) -> None:
        for index in (1, 2):
            port = free_port()
            command = [
                sys.executable,
                "-m",
                "uvicorn",
                "--factory",
                "app.asgi:create_app",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-access-log",
                "--no-proxy-headers",
            ]
            api = Proc(f"api-{index}", command, self.run_dir / f"api-{index}.log")
            api.start(self.env())
            self.apis.append(api)
            self.api_urls.append(f"http://127.0.0.1:{port}")
        for index in (1, 2):
            command = [sys.executable, "-m", "app.testing.worker", "--module", WORKER_MODULE]
            self.workers.append(Proc(f"worker-{index}", command, self.run_dir / f"worker-{index}.log"))
            self.start_worker(index - 1)
        for api, url in zip(self.apis, self.api_urls, strict=True):
            self._wait_healthy(api, url)
        for worker in self.workers:
            self.wait_worker_ready(worker)

    def _wait_healthy(self, api: Proc, url: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not api.alive:
                raise RuntimeError(f"{api.name} exited: see {api.log}\n{api.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"{api.name} did not answer /health within {timeout:g} s: see {api.log}")

    def start_worker(self, index: int) -> None:
        self.workers[index].start(self.env())

    def wait_worker_ready(self, worker: Proc, timeout: float = 60.0) -> None:
        """Until this start's log says it serves (the log holds every start: count the lines)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not worker.alive:
                raise RuntimeError(f"{worker.name} exited: see {worker.log}\n{worker.log_tail()}")
            with contextlib.suppress(OSError):
                if worker.log.read_text(errors="replace").count(WORKER_READY_LINE) >= worker.starts:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"{worker.name} did not start serving within {timeout:g} s: see {worker.log}")

    # --- Stripe stub: a process that loads its state before it listens -----------------------------

    def spawn_stripe(self) -> None:
        """Start the next stub process and wait until it has imported; it then waits for its state file
        (``serve_stripe``), so an outage lasts as long as the soak says, not as long as an import takes."""
        command = [sys.executable, "-m", "bench.soak.stripe_server", "--port", str(self.stripe_port)]
        proc = Proc("stripe", command, self.run_dir / "stripe.log")
        proc.start({}, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert proc.process is not None
        read_ready(proc.process.stdout, proc, word="waiting")
        self.stripe_next = proc

    def serve_stripe(self, state_file: Path) -> None:
        proc = self.stripe_next
        assert proc is not None and proc.process is not None and proc.process.stdin is not None
        proc.process.stdin.write(f"{state_file}\n".encode())
        proc.process.stdin.flush()
        read_ready(proc.process.stdout, proc)
        self.stripe, self.stripe_next = proc, None

    def kill_stripe(self) -> None:
        if self.stripe is not None:
            self.stripe.signal(signal.SIGKILL)
            self.stripe.wait(10.0)

    # --- faults --------------------------------------------------------------------------------------

    def restart_redis(self, down_seconds: float) -> float:
        """SIGTERM (Redis writes its append-only file), a pause, start again on the same port; seconds down."""
        started = time.monotonic()
        embedded.stop_all(self.data_dir, ["Redis"])
        time.sleep(down_seconds)
        embedded.ensure_redis(self.data_dir, self.redis_port)
        return time.monotonic() - started

    def crash_postgres(self) -> None:
        """Immediate shutdown (SIGQUIT to the postmaster): sessions die, no checkpoint, crash recovery at start."""
        pid_file = self.data_dir.resolve() / "postgres" / "postmaster.pid"
        pid = int(pid_file.read_text().splitlines()[0])
        os.kill(pid, signal.SIGQUIT)
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).wait(30)

    def start_postgres(self) -> None:
        embedded.ensure_postgres(self.data_dir, self.pg_port, database="soak", durable=True)

    # --- end -----------------------------------------------------------------------------------------

    def stop(self) -> None:
        for proc in [*self.workers, *self.apis]:
            proc.signal(signal.SIGTERM)
        for proc in [*self.workers, *self.apis]:
            proc.stop(timeout=20.0)
        for stub in (self.stripe, self.stripe_next, self.sentry, self.clerk):
            if stub is not None:
                stub.signal(signal.SIGKILL)
                stub.wait(5.0)
        with contextlib.suppress(Exception):
            embedded.stop_all(self.data_dir)
