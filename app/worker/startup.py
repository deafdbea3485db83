"""What the worker says at start: what it loaded, and what is wrong around it."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from app.queue.arq_adapter import peek, queued_count, version_mismatch
from app.queue.job import CronJob
from app.queue.queues import QueueName, poll_delay
from app.queue.registry import JobRegistry
from app.worker.arq_worker import rerun_after_kill_seconds

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from app.core.resources import Resources
    from app.core.settings import Settings

logger = logging.getLogger(__name__)

UNSERVED_JOBS_NAMED = 10
"""The first jobs of an unserved queue whose class names the start-up error lists."""


def log_loaded(registry: JobRegistry, queues: list[str], crons: list[type[CronJob]], resources: Resources) -> None:
    settings = resources.settings
    logger.info("Worker loaded modules: %s.", ", ".join(module.name for module in registry.modules) or "none")
    for queue in queues:
        jobs = registry.jobs_on(queue)
        bound = rerun_after_kill_seconds(jobs, resources)
        logger.info(
            "Queue %s: jobs %s (a killed worker's job runs again within %d s).",
            queue,
            ", ".join(job_cls.name() for job_cls in jobs),
            bound,
        )
    for cron in crons:
        logger.info("Cron %s scheduled: %s (UTC).", cron.name(), cron.schedule(settings))
    logger.info(
        "Worker serving %s (max %d jobs at a time per queue, poll every %g s on the webhook queues and %g s on the "
        "others, shutdown grace %d s).",
        ", ".join(queues),
        settings.worker_max_jobs,
        settings.worker_poll_delay_seconds,
        poll_delay(QueueName.CRON, settings.worker_poll_delay_seconds),
        settings.worker_shutdown_grace_seconds,
    )


def check_arq_adapter() -> None:
    """Warn when the installed arq is not the one ``app.queue.arq_adapter`` was checked against."""
    mismatch = version_mismatch()
    if mismatch:
        logger.warning("%s", mismatch)


async def check_redis_policy(redis: Redis) -> None:
    try:
        info: dict[str, Any] = await redis.info("memory")
    except Exception as exc:
        logger.warning("Could not read Redis' maxmemory-policy (%s): make sure it is noeviction.", exc)
        return
    policy = info.get("maxmemory_policy", "?")
    if policy != "noeviction":
        logger.warning(
            "REDIS MAXMEMORY-POLICY IS %r, NOT 'noeviction': under memory pressure Redis will silently "
            "delete queued jobs. Set `maxmemory-policy noeviction` in redis.conf (or CONFIG SET "
            "maxmemory-policy noeviction) on the queue's Redis.",
            policy,
        )


async def report_unserved_queues(redis: Redis, settings: Settings, served: list[str], known: list[str]) -> None:
    """Jobs waiting on a known queue no loaded module uses: their module is not listed, so nothing runs them."""
    for queue in known:
        if queue in served:
            continue
        waiting = await queued_count(redis, settings, queue)
        if not waiting:
            continue
        names = {name or "<unreadable>" for name in await peek(redis, settings, queue, UNSERVED_JOBS_NAMED)}
        logger.error(
            "%d job(s) wait on %s (%s), but no module this worker loads uses that queue: their module is "
            "not listed in app/runtime.py (WORKER_MODULES), so no worker runs them. List the module there.",
            waiting,
            queue,
            ", ".join(sorted(names)) or "?",
        )
