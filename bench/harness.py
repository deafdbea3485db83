"""The benchmark run: its own database, Redis namespace and processes; every figure next to its reference.

Phases, in order (each one's figures land in ``Run.results``):

1. intake: the product's ``POST /webhooks/stripe`` against the ceiling app
   (``bench/ceiling_app.py``) at a fixed concurrency, alternating rounds; then
   ``POST /webhooks/clerk`` on the product. No worker runs meanwhile.
2. pipeline: Clerk events at a steady rate through the API and one worker;
   latency from each 200 to the row's ``processed_at``.
3. drain: a backlog of Clerk events (rows + queued jobs, released at once)
   drained by one and by two worker processes, and the same number of no-op and
   one-UPDATE jobs (``bench/jobs.py``) drained by the same workers.
4. crons: a large inbox bulk-loaded with SQL; one recovery tick and each
   retention batch timed in this process with the product's functions.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import psutil
from redis.asyncio import Redis
from sqlalchemy.engine import make_url

from app.core.resources import Resources
from app.core.settings import load_settings
from app.testing.deliveries import generate_whsec
from app.webhooks import maintenance
from app.webhooks.jobs import ProcessWebhookEventData, ProcessWebhookEventJob, deduplication_id
from bench import loadgen
from bench.deliveries import clerk_mix, clerk_set, sign_clerk, stripe_set
from bench.jobs import CREATE_ITEM_TABLE, ITEM_TABLE, BenchItem, BenchNoopJob, BenchPingJob, BenchUpdateJob, ready_key
from bench.processes import ROOT, Managed, Processes

DEFAULT_DATABASE_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
QUEUE = "webhook-queue"
HELD_BACK = timedelta(hours=1)  # backlog jobs are queued this far in the future, then released at once

# Sets every queued job of a queue due now (score 0 would read as "finished" to arq).
_RELEASE_LUA = """
local members = redis.call('ZRANGE', KEYS[1], 0, -1)
for i = 1, #members do redis.call('ZADD', KEYS[1], ARGV[1], members[i]) end
return #members
"""


@dataclass(frozen=True)
class Mode:
    name: str
    intake_seconds: float
    intake_warmup_seconds: float
    intake_rounds: int
    pipeline_seconds: float
    pipeline_warmup_seconds: float
    drain_events: int
    crons_processed: int
    crons_pending: int
    pipeline_rate: float = 200.0
    connections: int = 64
    reference_drains_2w: bool = True  # the no-op and UPDATE jobs by two workers too (for the record)


MODES = {
    "smoke": Mode("smoke", 1.0, 0.0, 1, 1.5, 0.5, 200, 5_000, 100, reference_drains_2w=False),
    "quick": Mode("quick", 8.0, 2.0, 1, 15.0, 2.0, 3_000, 100_000, 1_000),
    "full": Mode("full", 15.0, 3.0, 3, 60.0, 3.0, 20_000, 1_000_000, 1_000),
}


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


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
            self.pool = await asyncpg.create_pool(_asyncpg_dsn(self.db_url), min_size=1, max_size=4)
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
            }
            self.resources = Resources.open(load_settings(self.env))
            resources_opened = True
            yield
        finally:
            self.processes.stop_all()
            if resources_opened:
                await self.resources.close()
            with contextlib.suppress(Exception):
                await self.pool.close()
            await self._drop_redis_keys()
            await self.redis.aclose()
            admin = await asyncpg.connect(_asyncpg_dsn(self.database_url))
            try:
                await admin.execute(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
            finally:
                await admin.close()
            if self.keep:
                self.log(f"logs kept in {self.directory}")
            else:
                shutil.rmtree(self.directory, ignore_errors=True)

    async def _drop_redis_keys(self) -> None:
        for pattern in (f"{self.namespace}*", f"arq:*:{self.namespace}*"):
            batch = []
            async for key in self.redis.scan_iter(match=pattern, count=5000):
                batch.append(key)
                if len(batch) >= 5000:
                    await self.redis.delete(*batch)
                    batch = []
            if batch:
                await self.redis.delete(*batch)

    async def _reset_inbox(self) -> None:
        await self._drop_redis_keys()
        tables = "webhook_event, workspace_member, workspace, app_user"
        await self.pool.execute(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")

    async def _start_api(self) -> None:
        self.api_url, self.api = await asyncio.to_thread(
            self.processes.start_uvicorn, "api", "api", "app.asgi:create_app", self.env, self.api_workers
        )

    # ------------------------------------------------------------------ intake

    async def intake(self) -> None:
        mode = self.mode
        ceiling_env = {**self.env, "BENCH_CEILING_DSN": _asyncpg_dsn(self.db_url)}
        ceiling_env["REDIS_NAMESPACE"] = f"{self.namespace}ceiling:"
        api_task = asyncio.create_task(self._start_api())
        ceiling_url, ceiling = await asyncio.to_thread(
            self.processes.start_uvicorn,
            "ceiling",
            "ceiling",
            "bench.ceiling_app:create_app",
            ceiling_env,
            self.api_workers,
        )
        await api_task
        generator = "wrk" if self.use_wrk and loadgen.wrk_path() else "python"
        self.results["load_generator"] = generator
        if generator == "python" and self.use_wrk:
            self.notes.append("wrk is not installed: the intake load came from the Python client (bench/loadgen.py)")
        secret = self.env["STRIPE_WEBHOOK_SECRET"]
        cap = 12_000 if generator == "wrk" else 6_000  # deliveries per second a set is sized for
        runs: dict[str, list[loadgen.LoadResult]] = {"product": [], "ceiling": []}
        cpu: dict[str, list[float]] = {"product": [], "ceiling": []}
        assert self.api is not None
        servers = {"product": self.api, "ceiling": ceiling}
        counter = 0

        async def measure(target: str, url: str, seconds: float, record: bool) -> None:
            nonlocal counter
            counter += 1
            signed = stripe_set(secret, int(seconds * cap) + 1000, f"{target[0]}{counter:03d}")
            lines, template = signed.write(self.directory, f"stripe-{counter}")
            profiler = self._profile("api-intake", self.api, seconds) if record and target == "product" else None
            server = servers[target]
            cpu_before = _cpu_seconds(server)
            result = await loadgen.run_closed_loop(
                url, lines, template, seconds=seconds, connections=mode.connections, use_wrk=self.use_wrk
            )
            cpu_us = (_cpu_seconds(server) - cpu_before) / max(1, result.requests) * 1e6
            if profiler:
                await profiler
            lines.unlink()
            if record:
                runs[target].append(result)
                cpu[target].append(cpu_us)
                self.log(
                    f"  intake {target:8s} {result.rps:8.0f} req/s  p50 {result.p50_ms:6.1f} ms  "
                    f"p99 {result.p99_ms:6.1f} ms  errors {result.errors}  server CPU {cpu_us:5.0f} us/request"
                )
            if result.wraps:
                self.notes.append(f"{target} intake ran out of pre-signed deliveries ({result.wraps} wraps)")

        targets = {"product": self.api_url, "ceiling": ceiling_url}
        for round_no in range(mode.intake_rounds):
            order = ["product", "ceiling"] if round_no % 2 == 0 else ["ceiling", "product"]
            for target in order:
                if mode.intake_warmup_seconds and round_no == 0:
                    await measure(target, targets[target], mode.intake_warmup_seconds, record=False)
                await measure(target, targets[target], mode.intake_seconds, record=True)
        self.processes.stop(ceiling)

        def median(target: str, attribute: str) -> float:
            return statistics.median(getattr(result, attribute) for result in runs[target])

        product_errors = sum(result.errors for result in runs["product"])
        if product_errors:
            self.notes.append(f"{product_errors} product intake requests failed or were not answered 200")
        self.results.update(
            intake_rps=median("product", "rps"),
            intake_p50_ms=median("product", "p50_ms"),
            intake_p99_ms=median("product", "p99_ms"),
            ceiling_rps=median("ceiling", "rps"),
            ceiling_p50_ms=median("ceiling", "p50_ms"),
            ceiling_p99_ms=median("ceiling", "p99_ms"),
            intake_cpu_us=statistics.median(cpu["product"]),
            ceiling_cpu_us=statistics.median(cpu["ceiling"]),
            intake_rounds=[round(result.rps) for result in runs["product"]],
            ceiling_rounds=[round(result.rps) for result in runs["ceiling"]],
        )
        self.results["intake_ratio"] = self.results["intake_rps"] / self.results["ceiling_rps"]

        clerk = clerk_set(self.env["CLERK_WEBHOOK_SIGNING_SECRET"], int(mode.intake_seconds * cap) + 1000, "ci")
        lines, template = clerk.write(self.directory, "clerk-intake")
        result = await loadgen.run_closed_loop(
            self.api_url,
            lines,
            template,
            seconds=mode.intake_seconds,
            connections=mode.connections,
            use_wrk=self.use_wrk,
        )
        self.log(f"  intake clerk    {result.rps:8.0f} req/s  p50 {result.p50_ms:6.1f} ms  p99 {result.p99_ms:6.1f} ms")
        self.results.update(intake_clerk_rps=result.rps, intake_clerk_p99_ms=result.p99_ms)
        await asyncio.sleep(min(1.0, mode.intake_seconds))  # requests in flight when the load generator stopped
        await self._reset_inbox()

    # ------------------------------------------------------------------ workers

    async def _start_worker(self) -> Managed:
        name = f"worker{len(self.workers) + 1}"
        worker = await asyncio.to_thread(self.processes.start_worker, name, self.env, ["--module", "bench.jobs:MODULE"])
        self.workers.append(worker)
        await self._wait_workers_ready()
        return worker

    async def _wait_workers_ready(self, within: float = 60.0) -> None:
        """Queue ping jobs until every worker process has run one: then each is polling."""
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
                await self.resources.queue.add(BenchPingJob, BenchItem(id=n))
            await asyncio.sleep(0.05)
        else:
            raise TimeoutError(f"workers not polling within {within:g} s: see {self.directory}")
        await self._wait_queue_empty(within=30.0)
        await self.redis.delete(key)

    async def _wait_queue_empty(self, within: float) -> float:
        """Poll the queue every 5 ms until arq removed its last job (arq does that when a job finishes)."""
        key = self.namespace + QUEUE
        deadline = time.perf_counter() + within
        while await self.redis.zcard(key):
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{key} still holds {await self.redis.zcard(key)} jobs after {within:g} s")
            await asyncio.sleep(0.005)
        return time.perf_counter()

    # ------------------------------------------------------------------ pipeline

    async def pipeline(self) -> None:
        mode = self.mode
        if self.api is None:
            await self._start_api()
        if not self.workers:
            await self._start_worker()
        total = int(mode.pipeline_rate * (mode.pipeline_seconds + mode.pipeline_warmup_seconds))
        skip = int(mode.pipeline_rate * mode.pipeline_warmup_seconds)
        events = clerk_mix(total, "p", seed=11)
        requests = sign_clerk(self.env["CLERK_WEBHOOK_SIGNING_SECRET"], events)
        host, _, port = self.api_url.removeprefix("http://").partition(":")
        sent = await loadgen.paced(host, int(port), requests, rate=mode.pipeline_rate)
        answered = {item.event_id: item for item in sent if item.status == 200}
        if len(answered) < total:
            self.notes.append(f"pipeline: {total - len(answered)} of {total} deliveries not answered 200")
        measured = [event.event_id for event in events[skip:] if event.event_id in answered]
        deadline = time.monotonic() + 60
        query = """
            SELECT event_id, extract(epoch FROM processed_at) AS processed FROM webhook_event
            WHERE provider = 'clerk' AND event_id = ANY($1::text[]) AND processed_at IS NOT NULL
        """
        while True:
            rows = await self.pool.fetch(query, measured)
            if len(rows) == len(measured) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        latencies = [(float(row["processed"]) - answered[row["event_id"]].answered_at) * 1000 for row in rows]
        if len(rows) < len(measured):
            # Counted at the time we stopped waiting, a lower bound: leaving them out would flatter the p99.
            done, gave_up = {row["event_id"] for row in rows}, time.time()
            late = [(gave_up - answered[event_id].answered_at) * 1000 for event_id in measured if event_id not in done]
            latencies += late
            self.notes.append(
                f"pipeline: {len(late)} events not processed within 60 s of the last delivery; "
                "counted with the time waited (a lower bound)"
            )
        failed = await self.pool.fetchval("SELECT count(*) FROM webhook_event WHERE last_error IS NOT NULL")
        if failed:
            self.notes.append(f"pipeline: {failed} events failed at least once (see webhook_event.last_error)")
        self.results.update(
            pipeline_p50_ms=percentile(latencies, 0.50),
            pipeline_p99_ms=percentile(latencies, 0.99),
            pipeline_max_ms=max(latencies, default=float("nan")),
            pipeline_events=len(latencies),
            pipeline_intake_p99_ms=percentile([item.latency * 1000 for item in sent], 0.99),
        )
        self.log(
            f"  pipeline {len(latencies)} events at {mode.pipeline_rate:g}/s: p50 "
            f"{self.results['pipeline_p50_ms']:.1f} ms, p99 {self.results['pipeline_p99_ms']:.1f} ms"
        )
        if self.api is not None:  # the API's connections are not needed any more
            self.processes.stop(self.api)
            self.api = None

    # ------------------------------------------------------------------ drain

    async def _release(self) -> float:
        """Make every held-back job due now; returns when that happened (perf_counter)."""
        started = time.perf_counter()
        now_ms = int(time.time() * 1000)
        await self.redis.eval(_RELEASE_LUA, 1, self.namespace + QUEUE, str(now_ms))  # type: ignore[misc]
        return started

    async def _enqueue_all(self, job_cls: Any, items: Sequence[Any], ids: Callable[[Any], str | None]) -> None:
        for start in range(0, len(items), 50):
            chunk = items[start : start + 50]
            added = await asyncio.gather(
                *(
                    self.resources.queue.add(job_cls, item, deduplication_id=ids(item), delay=HELD_BACK)
                    for item in chunk
                )
            )
            if any(job_id is None for job_id in added):
                raise RuntimeError(f"{job_cls.name()}: a backlog job was not queued")

    async def _drain(self, label: str, count: int) -> float:
        timeout = max(60.0, count / 50)
        profiler = self._profile(f"worker-{label}", self.workers[0], None) if self.profile else None
        cpu = [psutil.Process(worker.process.pid) for worker in self.workers]
        cpu_before = [process.cpu_times() for process in cpu]
        services_before = _service_cpu_seconds()
        psutil.cpu_percent()
        started = await self._release()
        ended = await self._wait_queue_empty(timeout)
        machine = psutil.cpu_percent()
        services = {
            name: (seconds - services_before.get(name, 0.0)) for name, seconds in _service_cpu_seconds().items()
        }
        if profiler:
            profiler.cancel()
        seconds = ended - started
        busy = [
            (after.user + after.system - before.user - before.system) / seconds * 100
            for before, after in zip(cpu_before, (process.cpu_times() for process in cpu), strict=True)
        ]
        rate = count / seconds
        cpu_ms = sum(busy) / 100 * seconds / count * 1000
        self.cpu_ms[label] = cpu_ms
        self.machine_cores[label] = machine / 100 * (os.cpu_count() or 1)
        self.pipeline_cores[label] = sum(busy) / 100 + sum(services.values()) / seconds
        shares = ", ".join(f"{name} {used / seconds:.2f}" for name, used in services.items())
        self.log(
            f"  drain {label:12s} {count} jobs in {seconds:6.2f} s: {rate:7.0f} /s  {cpu_ms:5.2f} worker CPU ms/job "
            f"(worker CPU {', '.join(f'{b:.0f}%' for b in busy)}; machine {machine:.0f}% of {os.cpu_count()} cores; "
            f"cores used by {shares})"
        )
        if label.startswith("clerk"):
            self.notes.append(
                f"drain {label}: cores busy: workers {sum(busy) / 100:.2f}, {shares}, "
                f"machine {self.machine_cores[label]:.2f} of {os.cpu_count()}"
            )
        return rate

    async def _clerk_backlog(self, count: int, tag: str) -> None:
        events = clerk_mix(count, tag, seed=sum(map(ord, tag)))
        records = [("clerk", event.event_id, event.event_type, event.body) for event in events]
        async with self.pool.acquire() as connection:
            await connection.copy_records_to_table(
                "webhook_event", records=records, columns=["provider", "event_id", "type", "payload"]
            )
            rows = await connection.fetch("SELECT id FROM webhook_event WHERE processed_at IS NULL")
        ids = [row["id"] for row in rows]
        data = [ProcessWebhookEventData(event_row_id=row_id) for row_id in ids]
        await self._enqueue_all(ProcessWebhookEventJob, data, lambda item: deduplication_id(item.event_row_id))

    async def _check_clerk(self, count: int, label: str) -> None:
        row = await self.pool.fetchrow(
            "SELECT count(*) FILTER (WHERE processed_at IS NOT NULL) AS done, "
            "count(*) FILTER (WHERE last_error IS NOT NULL OR attempts > 1) AS retried FROM webhook_event"
        )
        if row["done"] != count:
            self.notes.append(f"drain {label}: {row['done']} of {count} events processed")
        if row["retried"]:
            self.notes.append(f"drain {label}: {row['retried']} events needed more than one attempt")

    async def _reference_drains(self, suffix: str) -> tuple[float, float]:
        count = self.mode.drain_events
        items = [BenchItem(id=n) for n in range(1, count + 1)]
        await self._enqueue_all(BenchNoopJob, items, lambda item: None)
        noop = await self._drain(f"noop {suffix}", count)
        await self.pool.execute(f"TRUNCATE {ITEM_TABLE}")
        await self.pool.execute(f"INSERT INTO {ITEM_TABLE} (id) SELECT generate_series(1, $1::int)", count)
        await self._enqueue_all(BenchUpdateJob, items, lambda item: None)
        update = await self._drain(f"update {suffix}", count)
        done = await self.pool.fetchval(f"SELECT count(*) FROM {ITEM_TABLE} WHERE n = 1")
        if done != count:
            self.notes.append(f"update drain {suffix}: {done} of {count} rows updated once")
        return noop, update

    async def _warm_up(self) -> None:
        """A few Clerk events through every worker first: a fresh worker prepares its statements on the way."""
        await self._reset_inbox()
        await self._clerk_backlog(max(50, self.mode.drain_events // 20), "warm")
        await self._release()
        await self._wait_queue_empty(within=60.0)
        await self._reset_inbox()

    async def drain(self) -> None:
        count = self.mode.drain_events
        if not self.workers:
            await self._start_worker()
        await self._warm_up()
        await self._clerk_backlog(count, "d1")
        self.results["drain_eps_1w"] = await self._drain("clerk 1w", count)
        await self._check_clerk(count, "1 worker")
        noop, update = await self._reference_drains("1w")
        self.results.update(noop_eps=noop, update_eps=update)
        self.results.update(
            drain_cpu_ms_1w=self.cpu_ms["clerk 1w"],
            noop_cpu_ms=self.cpu_ms["noop 1w"],
            update_cpu_ms=self.cpu_ms["update 1w"],
            # The worker, Postgres and Redis share this machine: with one worker they keep some cores busy
            # per event, so no number of workers drains faster than cores / those cores (x that rate).
            drain_2w_machine_bound=min(2.0, (os.cpu_count() or 1) / max(self.pipeline_cores["clerk 1w"], 0.01)),
        )

        await self._start_worker()
        await self._warm_up()
        await self._clerk_backlog(count, "d2")
        self.results["drain_eps_2w"] = await self._drain("clerk 2w", count)
        await self._check_clerk(count, "2 workers")
        if self.mode.reference_drains_2w:
            noop2, update2 = await self._reference_drains("2w")
            self.results.update(noop_eps_2w=noop2, update_eps_2w=update2)
        for worker in list(self.workers):
            self.processes.stop(worker)
        self.workers = []
        await self._reset_inbox()

    # ------------------------------------------------------------------ crons

    async def crons(self) -> None:
        mode = self.mode
        await self._reset_inbox()
        payload = (
            "jsonb_build_object('type', 'user.updated', 'object', 'event', 'timestamp', 1700000000000 + g, "
            "'data', jsonb_build_object('id', 'user_' || g, 'object', 'user', 'first_name', 'Example', "
            "'last_name', 'Example', 'primary_email_address_id', 'idn_' || g, 'updated_at', 1700000000000 + g, "
            "'email_addresses', jsonb_build_array(jsonb_build_object('id', 'idn_' || g, "
            "'email_address', 'user' || g || '@example.org'))))"
        )
        started = time.perf_counter()
        # Processed rows past retention (40 days old), oldest first; pending rows stuck for an hour.
        await self.pool.execute(
            f"""
            INSERT INTO webhook_event (provider, event_id, type, payload, received_at, processed_at, attempts)
            SELECT 'clerk', 'msg_old' || g, 'user.updated', {payload},
                   now() - interval '40 days' + g * interval '1 ms',
                   now() - interval '40 days' + g * interval '1 ms' + interval '20 ms', 1
            FROM generate_series(1, $1::int) AS g
            """,
            mode.crons_processed,
        )
        await self.pool.execute(
            f"""
            INSERT INTO webhook_event (provider, event_id, type, payload, received_at, attempts, last_error)
            SELECT 'clerk', 'msg_stuck' || g, 'user.updated', {payload},
                   now() - interval '1 hour' + g * interval '1 ms', 1, 'RuntimeError: bench'
            FROM generate_series(1, $1::int) AS g
            """,
            mode.crons_pending,
        )
        await self.pool.execute("VACUUM ANALYZE webhook_event")
        self.log(
            f"  crons: loaded {mode.crons_processed} processed + {mode.crons_pending} pending rows "
            f"in {time.perf_counter() - started:.1f} s"
        )

        # A tick with nothing due: only the candidate read on the large table.
        oldest = await self.pool.fetchval("SELECT min(received_at) FROM webhook_event WHERE processed_at IS NULL")
        idle_now = oldest + timedelta(seconds=self.resources.settings.webhook_recovery_after_seconds)
        started = time.perf_counter()
        idle = await maintenance.recover(self.resources, now=idle_now)
        idle_ms = (time.perf_counter() - started) * 1000
        # The tick that matters: every stuck event due and not queued (e.g. after a Redis loss).
        started = time.perf_counter()
        report = await maintenance.recover(self.resources)
        tick_ms = (time.perf_counter() - started) * 1000
        if report.requeued != mode.crons_pending or idle.requeued:
            self.notes.append(
                f"recovery requeued {report.requeued} of {mode.crons_pending} (idle tick: {idle.requeued})"
            )
        await self._drop_redis_keys()

        batches: list[float] = []
        with _timed_statements(batches):
            started = time.perf_counter()
            deleted = await maintenance.delete_old_processed(self.resources)
            total = time.perf_counter() - started
        if deleted != mode.crons_processed:
            self.notes.append(f"retention deleted {deleted} of {mode.crons_processed} rows")
        self.results.update(
            recovery_tick_ms=tick_ms,
            recovery_idle_tick_ms=idle_ms,
            recovery_requeued=report.requeued,
            retention_batch_ms_max=max(batches) * 1000,
            retention_batch_ms_p50=percentile(batches, 0.5) * 1000,
            retention_batches=len(batches),
            retention_seconds=total,
        )
        self.log(
            f"  crons: recovery tick {tick_ms:.1f} ms ({report.requeued} requeued; idle tick {idle_ms:.1f} ms), "
            f"retention {deleted} rows in {len(batches)} batches, max {max(batches) * 1000:.0f} ms, "
            f"total {total:.1f} s"
        )

    # ------------------------------------------------------------------ profiling

    def _profile(self, name: str, managed: Managed | None, seconds: float | None) -> asyncio.Task[None] | None:
        """``--profile``: py-spy (if installed) on one process while a phase runs; flame graph in the run dir."""
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not self.profile or managed is None or not os.path.exists(py_spy):
            return None
        output = self.directory / f"profile-{name}.txt"
        command = [py_spy, "record", "--pid", str(managed.process.pid), "--format", "raw", "-o", str(output)]
        command += ["--rate", "200", "--nonblocking"]
        if seconds:
            command += ["--duration", str(max(1, int(seconds)))]

        async def run() -> None:
            process = await asyncio.create_subprocess_exec(
                *command, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
            )
            try:
                await process.wait()
            except asyncio.CancelledError:
                process.send_signal(2)
                await process.wait()
            self.notes.append(f"py-spy profile of {managed.name}: {output}")

        return asyncio.create_task(run())


def _service_cpu_seconds() -> dict[str, float]:
    """CPU seconds used so far by the Postgres and Redis servers on this machine (all their processes)."""
    totals = {"postgres": 0.0, "redis": 0.0}
    for process in psutil.process_iter(["name"]):
        name = process.info["name"] or ""
        service = "postgres" if name.startswith("postgres") else "redis" if name.startswith("redis-server") else None
        if service is None:
            continue
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            totals[service] += times.user + times.system
    return totals


def _cpu_seconds(managed: Managed) -> float:
    """User + system CPU time of a process and its children (uvicorn --workers)."""
    total = 0.0
    for pid in managed.pids():
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


@contextlib.contextmanager
def _timed_statements(durations: list[float]) -> Any:
    """Time each statement the inbox upkeep runs through ``driver_connection`` (one per retention batch)."""
    original = maintenance.driver_connection

    class Timed:
        def __init__(self, connection: Any) -> None:
            self._connection = connection

        def __getattr__(self, name: str) -> Any:
            attribute = getattr(self._connection, name)
            if name not in ("execute", "fetch", "fetchrow", "fetchval"):
                return attribute

            async def timed(*args: Any, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return await attribute(*args, **kwargs)
                finally:
                    durations.append(time.perf_counter() - started)

            return timed

    @contextlib.asynccontextmanager
    async def timed_connection(db: Any) -> AsyncIterator[Any]:
        async with original(db) as connection:
            yield Timed(connection)

    maintenance.driver_connection = timed_connection
    try:
        yield
    finally:
        maintenance.driver_connection = original
