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

Backlogs become due at one instant through the product's queue (``bench/backlog.py``).
A phase asks the run's fleet for the API and the workers it needs (``bench/fleet.py``:
``await run.fleet.api()``, ``await run.fleet.workers(count, queues=...)``), which
read the run's Stripe stub (``run.stripe``, ``bench/stripe.py``); work no worker may
take goes through ``run.unserved``, a namespace no worker polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
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
from bench.fleet import Fleet
from bench.jobs import CREATE_ITEM_TABLE, PING_JOBS, BenchItem, ready_key
from bench.modes import Mode
from bench.processes import ROOT, Managed, Processes
from bench.stripe import BacklogStripeStub, stripe_env

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
    baseline_tree: str | None = None
    """A checkout of the product before a feature (``--baseline-tree``): what its "off" is measured against."""
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
    unserved: Resources = field(init=False)  # the same, queueing where no worker polls
    pool: asyncpg.Pool = field(init=False)
    redis: Redis = field(init=False)
    stripe: BacklogStripeStub = field(init=False)
    fleet: Fleet = field(init=False)
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
        self.stripe = BacklogStripeStub()
        resources_opened = False
        try:
            self.stripe.start()
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
                **stripe_env(self.stripe),  # nothing ever reaches Stripe from a bench
                # High enough to admit every bench request: the limiter still runs its script per request.
                "WEBHOOK_RATE_LIMIT_PER_MINUTE": "100000000",
                "WORKER_SHUTDOWN_GRACE_SECONDS": "5",
                "WORKER_MAX_JOBS": str(self.mode.worker_max_jobs),
                "LOG_FORMAT": "json",
                "LOG_LEVEL": "info",
            }
            self.resources = open_resources(load_settings(self.env), ())
            unserved = {**self.env, "REDIS_NAMESPACE": f"{self.namespace}unserved:"}
            self.unserved = open_resources(load_settings(unserved), ())
            resources_opened = True
            keep = self.mode.keep_processes
            self.fleet = Fleet(self.processes, self.env, keep, self.api_workers, self._wait_workers_ready)
            yield
        finally:
            self.processes.stop_all()
            self.stripe.stop()
            if resources_opened:
                await self.resources.close()
                await self.unserved.close()
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

    async def _wait_workers_ready(self, workers: list[Managed], queue: str, within: float = 60.0) -> None:
        """Queue ping jobs on ``queue`` until every one of ``workers`` has run one: then each is polling."""
        key = ready_key(self.namespace)
        await self.redis.delete(key)
        wanted = {str(worker.process.pid) for worker in workers}
        deadline = time.monotonic() + within
        n = 0
        while time.monotonic() < deadline:
            for worker in workers:
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
