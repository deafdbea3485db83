"""The worker process: one arq Worker per queue, a supervising loop, the cron scheduler, the outbox relay, signals.

SIGTERM or SIGINT: stop taking jobs, let running ones finish within
``WORKER_SHUTDOWN_GRACE_SECONDS``, cancel what is left (it stays queued for
another worker), exit 0. A second signal skips the rest of the grace period.
Redis going away ends an arq Worker; the supervising loop logs, waits and
builds a new one until Redis answers again.

Every worker relays staged jobs (``app.queue.outbox``) to the queue every
0.5 s, whatever queues it serves, so a job staged by a process that died right
after its commit is queued within about a second. A burst worker relays what
is staged once, before it takes jobs.

The arq Workers are stopped cooperatively (their own burst exit), not by
cancelling their loop: redis-py's connection check (``asyncio.timeout(0)``)
can swallow a cancellation, which would leave a loop polling forever. Where we
must cancel (jobs past the grace period), we cancel again until they end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from arq.worker import Worker

from app.core.resources import Resources
from app.core.sentry import flush_sentry
from app.queue.crons import Clock
from app.queue.heartbeat import beat_until
from app.queue.outbox import OutboxRelayLoop
from app.queue.registry import JobRegistry
from app.queue.scheduler import CronScheduler
from app.worker.arq_worker import build_arq_worker, quiet_arq_logs
from app.worker.metrics_server import WorkerMetrics, prime_series
from app.worker.startup import check_redis_policy, log_loaded, report_unserved_queues

logger = logging.getLogger(__name__)
RECONNECT_FIRST_DELAY_SECONDS = 0.5
RECONNECT_MAX_DELAY_SECONDS = 5.0
CANCELLED_JOBS_FINISH_SECONDS = 10.0
LOOPS_STOP_SECONDS = 10.0


class WorkerProcess:
    def __init__(
        self,
        resources: Resources,
        registry: JobRegistry,
        queues: list[str],
        *,
        all_queues: bool,
        burst: bool = False,
        clock: Clock | None = None,
    ) -> None:
        self.resources = resources
        self.settings = resources.settings
        self.registry = registry
        self.queues = queues
        self.all_queues = all_queues
        self.burst = burst
        self.crons = [cron for cron in registry.crons.values() if cron.queue in queues]
        self.scheduler = CronScheduler(
            resources.queue,
            resources.db,
            resources.settings,
            self.crons,
            clock=clock,
            interval_seconds=0.05 if clock is not None else 0.5,
        )
        self.relay = OutboxRelayLoop(resources.queue)
        self.metrics = WorkerMetrics(resources.settings)
        self.live: dict[str, Worker] = {}
        self.retired: list[Worker] = []
        self.stopping = asyncio.Event()
        self.hurry = asyncio.Event()
        self._redis_checked = False
        self._janitors: set[asyncio.Task[None]] = set()

    async def run(self) -> int:
        quiet_arq_logs()
        log_loaded(self.registry, self.queues, self.crons, self.resources)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        if self.burst:
            await self.relay.drain()
        else:
            jobs = [name for name, job in self.registry.jobs.items() if job.queue in self.queues]
            prime_series(jobs, {provider for module in self.registry.modules for provider in module.webhook_handlers})
            self.metrics.serve()
        supervisors = [asyncio.create_task(self._supervise(queue), name=f"queue {queue}") for queue in self.queues]
        loops = list(supervisors)
        if not self.burst:
            loops.append(asyncio.create_task(self.scheduler.run(), name="cron scheduler"))
            loops.append(asyncio.create_task(self.relay.run(), name="outbox relay"))
            beat = beat_until(self.resources.redis, self.settings, self.stopping)
            loops.append(asyncio.create_task(beat, name="heartbeat"))
        stop = asyncio.create_task(self.stopping.wait())
        await asyncio.wait([stop, *supervisors], return_when=asyncio.FIRST_COMPLETED)
        if self.burst and not self.stopping.is_set():
            await asyncio.gather(*supervisors)  # each returns once its queue is empty
        else:
            self.scheduler.stop()
            self.relay.stop()
            await self._drain()
            self._end_loops()
            await _cancel_until_done([*loops, stop], within=LOOPS_STOP_SECONDS, cancel_first=False)
        await self._close_pools()
        self.metrics.close()
        logger.info("Worker stopped.")
        flush_sentry()
        return 0

    def _on_signal(self, sig: signal.Signals) -> None:
        if self.stopping.is_set():
            logger.warning("%s again: cancelling the running jobs now.", sig.name)
            self.hurry.set()
            return
        logger.info(
            "%s received: taking no new jobs; running jobs get up to %d s to finish.",
            sig.name,
            self.settings.worker_shutdown_grace_seconds,
        )
        for worker in self.live.values():
            worker.allow_pick_jobs = False
        self.stopping.set()

    async def _supervise(self, queue: str) -> None:
        delay = RECONNECT_FIRST_DELAY_SECONDS
        reconnecting = False
        while not self.stopping.is_set():
            worker = build_arq_worker(
                queue, self.registry, self.resources, burst=self.burst, on_startup=self._on_connect(queue, reconnecting)
            )
            self.live[queue] = worker
            try:
                await worker.main()
                return  # its queue is empty (burst), or it was told to end (stopping)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.retired.append(worker)
                self.live.pop(queue, None)
                self._janitors.add(task := asyncio.create_task(self._retire(worker)))
                task.add_done_callback(self._janitors.discard)
                reconnecting = True
                logger.warning(
                    "Queue %s: Redis unavailable (%s: %s); reconnecting in %.1f s. Running jobs go on.",
                    queue,
                    type(exc).__name__,
                    exc,
                    delay,
                )
            if await self._sleep_unless_stopping(delay):
                return
            delay = min(delay * 2, RECONNECT_MAX_DELAY_SECONDS)

    def _on_connect(self, queue: str, reconnecting: bool) -> Callable[[dict[str, Any]], Awaitable[None]]:
        async def on_startup(ctx: dict[str, Any]) -> None:
            if reconnecting:
                logger.info("Queue %s: connected to Redis again; taking jobs.", queue)
            if self._redis_checked:
                return
            self._redis_checked = True
            await check_redis_policy(ctx["redis"])
            if self.all_queues:
                await report_unserved_queues(ctx["redis"], self.settings, self.queues)

        return on_startup

    async def _sleep_unless_stopping(self, seconds: float) -> bool:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.stopping.wait()
        return self.stopping.is_set()

    async def _retire(self, worker: Worker) -> None:
        await asyncio.gather(*worker.tasks.values(), return_exceptions=True)
        await _close_quietly(worker)

    def _all_workers(self) -> list[Worker]:
        return [*self.live.values(), *self.retired]

    def _running_tasks(self) -> list[asyncio.Task[Any]]:
        return [task for worker in self._all_workers() for task in worker.tasks.values() if not task.done()]

    async def _drain(self) -> None:
        for worker in self._all_workers():
            worker.allow_pick_jobs = False
        deadline = asyncio.get_running_loop().time() + self.settings.worker_shutdown_grace_seconds
        while self._running_tasks() and not self.hurry.is_set():
            if asyncio.get_running_loop().time() >= deadline:
                break
            await asyncio.sleep(0.05)
        left = self._running_tasks()
        if left:
            logger.warning(
                "%d job(s) still running after the grace period: cancelled, they stay queued for another worker.",
                len(left),
            )
            # A cancelled job puts itself back in the queue (arq's finish_job) before its task ends.
            await _cancel_until_done(left, within=CANCELLED_JOBS_FINISH_SECONDS, cancel_first=True)

    def _end_loops(self) -> None:
        """arq's burst exit: the loop stops picking and returns at its next poll."""
        for worker in self.live.values():
            worker.allow_pick_jobs = False
            worker.burst = True
            worker.max_burst_jobs = 0

    async def _close_pools(self) -> None:
        for worker in self._all_workers():
            await _close_quietly(worker)


async def _cancel_until_done(tasks: Collection[asyncio.Task[Any]], *, within: float, cancel_first: bool) -> None:
    """Wait for ``tasks``, cancelling the ones still running (again and again: one cancel can be lost)."""
    pending = {task for task in tasks if not task.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    cancel = cancel_first
    while pending and loop.time() < deadline:
        if cancel:
            for task in pending:
                task.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.5)
        cancel = True
    if pending:
        logger.error("%d task(s) did not stop within %.0f s; exiting anyway.", len(pending), within)


async def _close_quietly(worker: Worker) -> None:
    pool = worker._pool
    if pool is None:
        return
    worker._pool = None
    with contextlib.suppress(Exception):
        await pool.delete(worker.health_check_key)
    try:
        await pool.aclose(close_connection_pool=True)
    except Exception:
        logger.debug("Closing a Redis pool failed", exc_info=True)
