"""The benchmark run: its own database, Redis namespace and processes; every figure next to its reference.

``Run`` sets up and tears down; its phases, in order, live in modules of their own
(each one's figures land in ``Run.results``):

1. intake (``bench/phase_intake.py``): the product's ``POST /webhooks/stripe``
   against the ceiling app (``bench/ceiling_app.py``), then ``POST /webhooks/clerk``.
2. pipeline (``bench/phase_pipeline.py``): Clerk events at a steady rate through
   the API and one worker; latency from each 200 to the row's ``processed_at``.
3. drain (``bench/phase_drain.py``): backlogs drained by one and by two workers.
4. crons (``bench/phase_crons.py``): one recovery tick and each retention batch
   timed on a large inbox.
5. adapter (``bench/phase_adapter.py``): the arq adapter against arq's own
   ``enqueue_job``, one job a call and in batches.
6. stripe_backlog (``bench/phase_stripe_backlog.py``): a Stripe backlog drained by
   two workers through the Stripe API budget, against a rate-limited Stripe stub.
7. isolation and fairness (``bench/phase_isolation.py``, ``bench/phase_fairness.py``):
   other tenants' events delivered while one organization's flood drains.
8. metrics_cost (``bench/phase_metrics_cost.py``): the metrics' cost to the intake
   and a worker.

Backlogs become due at one instant through the product's queue (``bench/backlog.py``);
workers serve the queues a phase names (``Run.start_workers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
from redis.asyncio import Redis
from sqlalchemy.engine import make_url

from app.core.resources import Resources
from app.core.settings import load_settings
from app.queue.queues import QueueName
from app.runtime import open_resources
from app.testing.deliveries import generate_whsec
from bench.jobs import CREATE_ITEM_TABLE, PING_JOBS, BenchItem, ready_key
from bench.modes import Mode
from bench.processes import ROOT, Managed, Processes

__all__ = ["CLERK_QUEUES", "DEFAULT_DATABASE_URL", "DEFAULT_REDIS_URL", "ROOT", "Run"]

DEFAULT_DATABASE_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
CLERK_QUEUE = str(QueueName.WEBHOOK_CLERK)
CLERK_QUEUES = (CLERK_QUEUE,)
"""What the drain, pipeline and metrics workers serve: the Clerk events' queue (the reference jobs' too)."""


def _asyncpg_dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _migrate(url: str) -> None:
    from alembic.config import Config

    from alembic import command

    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(ROOT / "alembic"))
    config.attributes["db_url"] = url
    command.upgrade(config, "head")


@dataclass
class Run:
    mode: Mode
    database_url: str
    redis_url: str
    use_wrk: bool = True
    api_workers: int = 1
    keep: bool = False
    profile: bool = False
    log: Callable[[str], None] = print
    results: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # set up by `session`
    directory: Path = field(init=False)
    namespace: str = field(init=False)
    db_name: str = field(init=False)
    db_url: str = field(init=False)
    env: dict[str, str] = field(init=False)
    processes: Processes = field(init=False)
    resources: Resources = field(init=False)
    pool: asyncpg.Pool = field(init=False)
    redis: Redis = field(init=False)
    api_url: str = field(init=False)
    api: Managed | None = None
    workers: list[Managed] = field(default_factory=list)
    cpu_ms: dict[str, float] = field(default_factory=dict)
    machine_cores: dict[str, float] = field(default_factory=dict)  # cores busy machine-wide during a drain
    pipeline_cores: dict[str, float] = field(default_factory=dict)  # ... by the workers, Postgres and Redis

    # ------------------------------------------------------------------ set-up

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[None]:
        tag = uuid.uuid4().hex[:10]
        self.directory = Path(tempfile.mkdtemp(prefix=f"bench_{tag}_"))
        self.namespace = f"bench{tag}:"
        self.db_name = f"bench_{tag}"
        self.processes = Processes(self.directory)
        self.results.update(database=self.db_name, redis_namespace=self.namespace)
        admin = await asyncpg.connect(_asyncpg_dsn(self.database_url))
        try:
            await admin.execute(f'CREATE DATABASE "{self.db_name}"')
        finally:
            await admin.close()
        self.db_url = make_url(self.database_url).set(database=self.db_name).render_as_string(hide_password=False)
        self.redis = Redis.from_url(self.redis_url, socket_timeout=10)
        resources_opened = False
        try:
            await asyncio.to_thread(_migrate, self.db_url)
            self.pool = await asyncpg.create_pool(self.db_dsn, min_size=1, max_size=4)
            await self.pool.execute(CREATE_ITEM_TABLE)
            secrets = {"stripe": generate_whsec(), "clerk": generate_whsec()}
            self.env = {
                "APP_ENV": "production",
                "DATABASE_URL": self.db_url,
                "REDIS_URL": self.redis_url,
                "REDIS_NAMESPACE": self.namespace,
                "STRIPE_WEBHOOK_SECRET": secrets["stripe"],
                "CLERK_WEBHOOK_SIGNING_SECRET": secrets["clerk"],
                "STRIPE_API_KEY": "sk_test_bench",
                "STRIPE_API_BASE": "http://127.0.0.1:9",  # nothing ever reaches Stripe from a bench
                # High enough to admit every bench request: the limiter still runs its script per request.
                "WEBHOOK_RATE_LIMIT_PER_MINUTE": "100000000",
                "WORKER_SHUTDOWN_GRACE_SECONDS": "5",
                "LOG_FORMAT": "json",
                "LOG_LEVEL": "info",
                "WORKER_METRICS_PORT": "0",  # several workers on one host; the metrics phase gives its own a port
            }
            self.resources = open_resources(load_settings(self.env), ())
            resources_opened = True
            yield
        finally:
            self.processes.stop_all()
            if resources_opened:
                await self.resources.close()
            with contextlib.suppress(Exception):
                await self.pool.close()
            await self.drop_redis_keys()
            await self.redis.aclose()
            admin = await asyncpg.connect(_asyncpg_dsn(self.database_url))
            try:
                await admin.execute(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
            finally:
                await admin.close()
            if self.keep or self.profile:  # a profile's note names a file in the run directory
                self.log(f"logs kept in {self.directory}")
            else:
                shutil.rmtree(self.directory, ignore_errors=True)

    # ------------------------------------------------------------------ shared by the phases

    @property
    def db_dsn(self) -> str:
        """The run's database as asyncpg takes it."""
        return _asyncpg_dsn(self.db_url)

    def queue_key(self, queue: str) -> str:
        """A queue as Redis holds it (with the run's namespace)."""
        return self.namespace + queue

    async def drop_redis_keys(self) -> None:
        for pattern in (f"{self.namespace}*", f"arq:*:{self.namespace}*"):
            batch = []
            async for key in self.redis.scan_iter(match=pattern, count=5000):
                batch.append(key)
                if len(batch) >= 5000:
                    await self.redis.delete(*batch)
                    batch = []
            if batch:
                await self.redis.delete(*batch)

    async def reset_inbox(self) -> None:
        await self.drop_redis_keys()
        tables = "webhook_event, workspace_member, workspace, app_user, billing_sync, job_outbox, workspace_change"
        # A running worker may still be finishing what a processed event led to (a seat change's member limit):
        # TRUNCATE then can deadlock with its statement, and the one chosen to fail is taken again.
        for attempt in range(5):
            try:
                await self.pool.execute(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")
                return
            except asyncpg.DeadlockDetectedError:
                if attempt == 4:
                    raise
                await asyncio.sleep(0.2)

    async def start_api(self) -> None:
        self.api_url, self.api = await asyncio.to_thread(
            self.processes.start_uvicorn, "api", "api", "app.asgi:create_app", self.env, self.api_workers
        )

    async def stop_api(self) -> None:
        if self.api is not None:
            await asyncio.to_thread(self.processes.stop, self.api)
            self.api = None

    # ------------------------------------------------------------------ workers

    async def start_worker(self) -> Managed:
        return (await self.start_workers(1))[0]

    async def start_workers(
        self,
        count: int,
        env: Mapping[str, str] | None = None,
        launcher: Sequence[str] = (),
        queues: Sequence[str] | None = CLERK_QUEUES,
    ) -> list[Managed]:
        """``count`` more worker processes, started together and seen polling; ``env``: settings over the run's
        (a phase's own); ``launcher``: what runs them (``Processes.start_worker``); ``queues``: the ones they serve
        (None: every queue of the loaded modules)."""
        started = []
        for _ in range(count):
            name = f"worker{len(self.workers) + 1}"
            worker = await asyncio.to_thread(
                self.processes.start_worker,
                name,
                {**self.env, **(env or {})},
                ["--module", "bench.jobs:MODULE"],
                launcher,
                queues,
            )
            self.workers.append(worker)
            started.append(worker)
        await self._wait_workers_ready(str(queues[0]) if queues else CLERK_QUEUE)
        return started

    async def stop_workers(self) -> None:
        for worker in list(self.workers):
            await asyncio.to_thread(self.processes.stop, worker)
        self.workers = []

    async def _wait_workers_ready(self, queue: str, within: float = 60.0) -> None:
        """Queue ping jobs on ``queue`` until every worker process has run one: then each is polling."""
        key = ready_key(self.namespace)
        await self.redis.delete(key)
        wanted = {str(worker.process.pid) for worker in self.workers}
        deadline = time.monotonic() + within
        n = 0
        while time.monotonic() < deadline:
            for worker in self.workers:
                if worker.process.poll() is not None:
                    raise RuntimeError(f"{worker.name} exited with {worker.process.returncode}: see {worker.log}")
            seen = {member.decode() for member in await self.redis.smembers(key)}  # type: ignore[misc]
            if wanted <= seen:
                break
            for _ in range(5):
                n += 1
                await self.resources.queue.add(PING_JOBS[queue], BenchItem(id=n))
            await asyncio.sleep(0.05)
        else:
            raise TimeoutError(f"workers not polling within {within:g} s: see {self.directory}")
        await self.wait_queue_empty(within=30.0, queues=(queue,))
        await self.redis.delete(key)

    async def wait_queue_empty(self, within: float, queues: Sequence[str] = CLERK_QUEUES) -> float:
        """Poll the queues every 5 ms until arq removed their last job (arq does that when a job finishes);
        returns when (``time.perf_counter()``)."""
        keys = [self.queue_key(queue) for queue in queues]

        async def left() -> int:
            async with self.redis.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.zcard(key)
                return sum(await pipe.execute())

        deadline = time.perf_counter() + within
        while await left():
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{', '.join(queues)} still hold {await left()} jobs after {within:g} s")
            await asyncio.sleep(0.005)
        return time.perf_counter()
