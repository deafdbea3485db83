"""The worker process: one arq Worker per queue, a supervising loop, the cron scheduler, signals.

SIGTERM or SIGINT: stop taking jobs, let running ones finish within
``WORKER_SHUTDOWN_GRACE_SECONDS``, cancel what is left (it stays queued for
another worker), exit 0. A second signal skips the rest of the grace period.
Redis going away ends an arq Worker; the supervising loop logs, waits and
builds a new one until Redis answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from arq.worker import Worker

from app.core.resources import Resources
from app.core.sentry import flush_sentry
from app.queue.crons import Clock
from app.queue.registry import JobRegistry
from app.queue.scheduler import CronScheduler
from app.worker.arq_worker import build_arq_worker, quiet_arq_logs
from app.worker.startup import check_redis_policy, log_loaded, report_unserved_queues

logger = logging.getLogger("app.worker")
RECONNECT_FIRST_DELAY_SECONDS = 0.5
RECONNECT_MAX_DELAY_SECONDS = 5.0
CANCELLED_JOBS_FINISH_SECONDS = 10.0


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
            resources, self.crons, clock=clock, interval_seconds=0.05 if clock is not None else 0.5
        )
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
        supervisors = [asyncio.create_task(self._supervise(queue), name=f"queue {queue}") for queue in self.queues]
        scheduler = None if self.burst else asyncio.create_task(self.scheduler.run(), name="cron scheduler")
        stop = asyncio.create_task(self.stopping.wait())
        await asyncio.wait([stop, *supervisors], return_when=asyncio.FIRST_COMPLETED)
        if not self.burst or self.stopping.is_set():
            await self._drain()
        else:
            await asyncio.gather(*supervisors)
        for task in [*supervisors, stop, *([scheduler] if scheduler else [])]:
            task.cancel()
        await asyncio.gather(*supervisors, stop, *([scheduler] if scheduler else []), return_exceptions=True)
        await self._close_pools()
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
                return  # burst: the queue is empty
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
        try:
            await asyncio.wait_for(self.stopping.wait(), seconds)
        except TimeoutError:
            return False
        return True

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
            for task in left:
                task.cancel()
            # Cancelled jobs put themselves back in the queue (arq's finish_job).
            await asyncio.wait(left, timeout=CANCELLED_JOBS_FINISH_SECONDS)

    async def _close_pools(self) -> None:
        for worker in self._all_workers():
            await _close_quietly(worker)


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
