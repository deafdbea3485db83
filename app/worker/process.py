"""The worker process: one arq Worker per queue, a supervising loop, the cron scheduler, the outbox relay, signals.

SIGTERM or SIGINT: each arq Worker is told to stop as arq itself stops on a
signal (``handle_sig_wait_for_completion``): it takes no new jobs, lets running
ones finish within ``WORKER_SHUTDOWN_GRACE_SECONDS``, then cancels what is left
(it stays queued for another worker); the process exits 0. A second signal
stops them at once (``handle_sig``). Redis going away ends an arq Worker; the
supervising loop logs, waits and builds a new one until Redis answers again.

Every worker relays staged jobs (``app.queue.outbox``) to the queue every
0.5 s, whatever queues it serves, so a job staged by a process that died right
after its commit is queued within about a second. A burst worker relays what
is staged once, before it takes jobs.

redis-py's connection check (``asyncio.timeout(0)``) can swallow the
cancellation arq sends its poll loop; a Worker still polling after its stop is
told again, until it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any

from arq.connections import ArqRedis
from arq.worker import Worker

from app.core.gc_tuning import settle_after_start_up
from app.core.resources import Resources
from app.core.sentry import flush_sentry
from app.queue.arq_driver import make_arq_redis
from app.queue.crons import Clock
from app.queue.heartbeat import beat_until
from app.queue.outbox import OutboxRelayLoop
from app.queue.registry import JobRegistry
from app.queue.scheduler import CronScheduler
from app.worker.arq_worker import WORKER_REDIS_TIMEOUT_SECONDS, build_arq_worker, quiet_arq_logs
from app.worker.metrics_server import WorkerMetrics, prime_series
from app.worker.startup import check_arq_adapter, check_redis_policy, log_loaded, report_unserved_queues

logger = logging.getLogger(__name__)
RECONNECT_FIRST_DELAY_SECONDS = 0.5
RECONNECT_MAX_DELAY_SECONDS = 5.0
CANCELLED_JOBS_FINISH_SECONDS = 10.0
LOOPS_STOP_SECONDS = 10.0
STOP_AGAIN_EVERY_SECONDS = 0.5
GRACE_ENDS_WARNING_SECONDS = 0.25


@dataclass
class _Served:
    """A queue's arq Worker and the Redis pool it was given (ours to close)."""

    worker: Worker
    pool: ArqRedis


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
        self.scheduler = CronScheduler(resources.queue, resources.db, resources.settings, self.crons, clock=clock)
        self.relay = OutboxRelayLoop(resources.queue)
        self.metrics = WorkerMetrics(resources.settings)
        self.live: dict[str, _Served] = {}
        self.stopping = asyncio.Event()
        self._redis_checked = False
        self._janitors: set[asyncio.Task[None]] = set()

    async def run(self) -> int:
        quiet_arq_logs()
        log_loaded(self.registry, self.queues, self.crons, self.resources)
        check_arq_adapter()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        if self.burst:
            await self.relay.drain()
        else:
            jobs = [name for name, job in self.registry.jobs.items() if job.queue in self.queues]
            prime_series(jobs, {provider for module in self.registry.modules for provider in module.webhook_handlers})
            self.metrics.serve()
        settle_after_start_up()
        supervisors = [asyncio.create_task(self._supervise(queue), name=f"queue {queue}") for queue in self.queues]
        loops: list[asyncio.Task[Any]] = []
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
            await self._until_stopped(supervisors)
            await _cancel_until_done([*loops, stop], within=LOOPS_STOP_SECONDS, cancel_first=False)
        await asyncio.gather(*self._janitors, return_exceptions=True)
        self.metrics.close()
        logger.info("Worker stopped.")
        flush_sentry()
        return 0

    def _on_signal(self, sig: signal.Signals) -> None:
        if self.stopping.is_set():
            logger.warning("%s again: cancelling the running jobs now.", sig.name)
            for served in self.live.values():
                served.worker.handle_sig(sig)
            return
        logger.info(
            "%s received: taking no new jobs; running jobs get up to %d s to finish.",
            sig.name,
            self.settings.worker_shutdown_grace_seconds,
        )
        self.stopping.set()
        for served in self.live.values():
            served.worker.handle_sig_wait_for_completion(sig)

    async def _until_stopped(self, supervisors: list[asyncio.Task[None]]) -> None:
        """Wait for every Worker to end; one still polling after its grace (a swallowed cancellation) is told again."""
        loop = asyncio.get_running_loop()
        grace = self.settings.worker_shutdown_grace_seconds
        tell_again_at = loop.time() + grace + STOP_AGAIN_EVERY_SECONDS
        deadline = loop.time() + grace + CANCELLED_JOBS_FINISH_SECONDS
        warn_at = loop.time() + max(grace - GRACE_ENDS_WARNING_SECONDS, 0.0)  # just before arq cancels them
        pending = {task for task in supervisors if not task.done()}
        warned = False
        while pending:
            wait = STOP_AGAIN_EVERY_SECONDS if warned else max(min(STOP_AGAIN_EVERY_SECONDS, warn_at - loop.time()), 0)
            _, pending = await asyncio.wait(pending, timeout=wait)
            if pending and not warned and loop.time() >= warn_at:
                warned = True
                self._warn_running_as_grace_ends()
            if pending and loop.time() >= deadline:
                logger.error("%d queue(s) did not stop in time; exiting anyway.", len(pending))
                await _cancel_until_done(pending, within=LOOPS_STOP_SECONDS, cancel_first=True)
                return
            if pending and loop.time() >= tell_again_at:
                for served in self.live.values():
                    if served.worker.main_task is not None and not served.worker.main_task.done():
                        served.worker.handle_sig(signal.SIGTERM)

    def _warn_running_as_grace_ends(self) -> None:
        running = sum(not task.done() for served in self.live.values() for task in served.worker.tasks.values())
        if running:
            logger.warning(
                "%d job(s) still running as the grace period ends: cancelled, they stay queued for another worker.",
                running,
            )

    async def _supervise(self, queue: str) -> None:
        delay = RECONNECT_FIRST_DELAY_SECONDS
        reconnecting = False
        while not self.stopping.is_set():
            pool = make_arq_redis(self.settings.require_redis_url(), timeout=WORKER_REDIS_TIMEOUT_SECONDS)
            worker = build_arq_worker(
                queue,
                self.registry,
                self.resources,
                pool,
                burst=self.burst,
                on_startup=self._on_connect(queue, reconnecting),
            )
            served = self.live[queue] = _Served(worker, pool)
            try:
                await worker.async_run()
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling() or not self.stopping.is_set():  # type: ignore[union-attr]
                    raise
                await self._close(served)  # arq stopped its loop: told to stop (signal)
                return
            except Exception as exc:
                self.live.pop(queue, None)
                self._janitors.add(task := asyncio.create_task(self._close(served)))
                task.add_done_callback(self._janitors.discard)
                reconnecting = True
                logger.warning(
                    "Queue %s: Redis unavailable (%s: %s); reconnecting in %.1f s. Running jobs go on.",
                    queue,
                    type(exc).__name__,
                    exc,
                    delay,
                )
            else:
                await self._close(served)
                return  # its queue is empty (burst)
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
                await report_unserved_queues(ctx["redis"], self.settings, self.queues, self.registry.known_queues())

        return on_startup

    async def _sleep_unless_stopping(self, seconds: float) -> bool:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.stopping.wait()
        return self.stopping.is_set()

    @staticmethod
    async def _close(served: _Served) -> None:
        """Let the Worker's jobs end (by themselves, or put back in the queue when arq cancelled them), then close."""
        await asyncio.gather(*served.worker.tasks.values(), return_exceptions=True)
        try:
            await served.worker.close()  # drops its health-check key
        except Exception:
            logger.debug("Closing a queue's arq Worker failed", exc_info=True)
        with contextlib.suppress(Exception):
            await served.pool.aclose(close_connection_pool=True)


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
