"""The fault schedule: each fault once, at a fixed fraction of the sending phase, healed by the soak.

| at  | fault |
|-----|-------|
| 10% | Postgres crash: immediate shutdown (SIGQUIT), a pause, start (crash recovery) on the same port |
| 25% | Redis restart: SIGTERM (it writes its append-only file), a pause, start on the same port |
| 40% | SIGKILL of worker 1, started again after a few seconds |
| 55% | Stripe stub outage: the process killed, a new one (same state) listens 30 s later (retries: a 13 s round) |
| 70% | SIGTERM of worker 2: it must finish its jobs and exit 0 within its grace period; started again |

Beside them, from 72% to 86% (60% in the short run), the endpoint outage drops a
share of the deliveries for good, and is repaired after the sending phase by the
backfill and both reconciliations (``outage.py``). The short run's Stripe
outage (16 s) comes at 88%, after the endpoint outage: Stripe's scenarios wait
while its stub is down, so over the endpoint outage's window it would leave no
Stripe delivery to drop.

Each fault starts once the one before has healed (in the short run that can be
later than its share). Postgres and Redis go first, and the doomed events are
sent only once both are back and the processes' pools have dropped their dead
connections: a try that cannot reach Postgres is not counted as an attempt,
and an event stored while Redis is down waits for a recovery tick before its
first try, so a doomed event caught by either would need a second round (and
a second tick) to be set aside. The noisy client waits for Redis too
(the limiter fails open while Redis is down).
"""

from __future__ import annotations

import asyncio
import signal
import time

from bench.soak.cluster import Cluster
from bench.soak.config import SoakConfig
from bench.soak.fault_record import FaultRecord
from bench.soak.findings import hold_alerts
from bench.soak.runtime import Driver, StubControl


class Faults:
    def __init__(self, config: SoakConfig, cluster: Cluster, stub: StubControl, driver: Driver) -> None:
        self.config = config
        self.cluster = cluster
        self.stub = stub
        self.driver = driver
        self.records: list[FaultRecord] = []
        span = config.send_seconds
        outage = config.stripe_outage_at * span
        # No flaky Stripe reads around the outage: one event would pay for both and could use up its attempts.
        driver.quiet_windows.append((outage - 8.0, outage + config.stripe_outage_seconds + 12.0))
        self.schedule = sorted(
            [
                (0.10, "Postgres restart", self.restart_postgres),
                (0.25, "Redis restart", self.restart_redis),
                (0.40, "SIGKILL worker", self.kill_worker),
                (config.stripe_outage_at, "Stripe stub outage", self.stripe_outage),
                (0.70, "SIGTERM worker", self.stop_worker),
            ],
            key=lambda fault: fault[0],
        )

    async def run(self) -> None:
        for fraction, name, inject in self.schedule:
            await self.driver.at(fraction * self.config.send_seconds)
            began = self.driver.now()
            print(f"soak: {began:6.1f}s fault: {name}", flush=True)
            try:
                note, ok = await inject()
            except Exception as exc:  # the soak's own failure to inject or heal: counted, the run goes on
                note, ok = f"could not inject or heal: {type(exc).__name__}: {exc}", False
                self.driver.postgres_back.set()
                self.driver.redis_back.set()
            self.records.append(FaultRecord(name, began, note, ok))

    async def kill_worker(self) -> tuple[str, bool]:
        worker = self.cluster.workers[0]
        worker.signal(signal.SIGKILL)
        await asyncio.to_thread(worker.wait, 10.0)
        await asyncio.sleep(self.config.kill_restart_after_seconds)
        self.cluster.start_worker(0)
        await asyncio.to_thread(self.cluster.wait_worker_ready, worker)
        return f"{worker.name} killed mid-jobs, started again", True

    async def stop_worker(self) -> tuple[str, bool]:
        worker = self.cluster.workers[1]
        worker.signal(signal.SIGTERM)
        limit = self.config.shutdown_grace_seconds + 20.0
        began = time.monotonic()
        code = await asyncio.to_thread(worker.wait, limit)
        took = time.monotonic() - began
        if code is None:
            worker.signal(signal.SIGKILL)
            await asyncio.to_thread(worker.wait, 10.0)
            note, ok = f"{worker.name} still running {limit:.0f} s after SIGTERM: killed (HANG)", False
        else:
            note, ok = f"{worker.name} exited {code} {took:.1f} s after SIGTERM", code == 0
        self.cluster.start_worker(1)
        await asyncio.to_thread(self.cluster.wait_worker_ready, worker)
        return note, ok

    async def restart_redis(self) -> tuple[str, bool]:
        down = await asyncio.to_thread(self.cluster.restart_redis, self.config.redis_down_seconds)
        self.driver.redis_back.set()
        return f"down {down:.1f} s", True

    async def restart_postgres(self) -> tuple[str, bool]:
        began = time.monotonic()
        await asyncio.to_thread(self.cluster.crash_postgres)
        await asyncio.sleep(self.config.postgres_down_seconds)
        await asyncio.to_thread(self.cluster.start_postgres)
        self.driver.postgres_back.set()
        return f"crashed (immediate shutdown), down {time.monotonic() - began:.1f} s", True

    async def stripe_outage(self) -> tuple[str, bool]:
        """Longer than a round of retries: the events it catches wait for a hold to end, none is set aside (the
        run's final check: only the doomed are)."""
        await asyncio.to_thread(self.cluster.spawn_stripe)  # the successor imports while the old one serves
        holds_before = hold_alerts(self.cluster.sentry_file)
        async with self.stub.lock:  # scenarios wait to change Stripe's state until it is back
            began = time.monotonic()
            self.cluster.kill_stripe()
            await asyncio.sleep(self.config.stripe_outage_seconds)
            state = self.stub.snapshot(self.cluster.run_dir)
            await asyncio.to_thread(self.cluster.serve_stripe, state)
        holds = hold_alerts(self.cluster.sentry_file) - holds_before
        return f"refused connections for {time.monotonic() - began:.1f} s; {holds} hold alert(s)", True
