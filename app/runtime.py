"""The composition root: which feature modules the API and the worker load, and how a process's resources are built.

The one place that knows every layer. Below it nothing lists modules or picks
a queue driver: the core is the ground floor, the queue types against what it
needs, and each feature module describes itself in its ``MODULE``.

Add your own feature module to ``API_MODULES`` (if it has routes), to
``WORKER_MODULES`` (if it has jobs, crons or webhook handlers), or to both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.billing.module import MODULE as BILLING
from app.clients.module import MODULE as CLIENTS
from app.core.db import Base, Database
from app.core.module import FeatureModule, LoadedModules
from app.core.redis import make_redis
from app.core.resources import Resources
from app.core.settings import Settings
from app.identity.module import MODULE as IDENTITY
from app.ops.module import MODULE as OPS
from app.queue.arq_driver import ArqQueue
from app.queue.job import JobContext
from app.queue.module import MODULE as QUEUE
from app.queue.registry import JobRegistry
from app.queue.sync_driver import SyncQueue
from app.system.module import MODULE as SYSTEM
from app.webhooks.module import MODULE as WEBHOOKS

API_MODULES: tuple[FeatureModule, ...] = (SYSTEM, QUEUE, WEBHOOKS, BILLING, IDENTITY, OPS)
WORKER_MODULES: tuple[FeatureModule, ...] = (QUEUE, WEBHOOKS, CLIENTS, BILLING, IDENTITY)


def all_modules() -> list[FeatureModule]:
    """Every module either process loads, once each: whose tables Alembic migrates and whose commands the CLI has."""
    return list({module.name: module for module in (*API_MODULES, *WORKER_MODULES)}.values())


def all_models() -> list[type[Base]]:
    return [model for module in all_modules() for model in module.models]


def open_resources(
    settings: Settings,
    modules: Sequence[FeatureModule] = WORKER_MODULES,
    *,
    pool_size: int = 10,
    statement_timeout_seconds: float | None = None,
) -> Resources:
    """Build a process's connections without connecting (first use connects); ``modules`` are the ones it runs."""
    resources = Resources(
        settings=settings,
        db=Database.from_settings(settings, pool_size=pool_size, statement_timeout_seconds=statement_timeout_seconds),
        redis=make_redis(settings.require_redis_url()),
    )
    resources.shared(LoadedModules, lambda: LoadedModules(modules))  # kept now: loaded_modules(resources) reads it
    if settings.message_queue_driver == "sync":
        jobs = JobRegistry.from_modules(modules).jobs

        def context(job_id: str, retry_limit: int, queue: str) -> JobContext:
            return JobContext(resources, job_id, 1, retry_limit, queue)

        resources.queue = SyncQueue(settings, resources.db, jobs, context)
    else:
        resources.queue = ArqQueue(settings, resources.db)
    return resources


@dataclass(frozen=True)
class Runtime:
    """What the CLI's commands get (``app.state.runtime``): the worker's modules and resources like its own."""

    settings: Settings
    worker_modules: Sequence[FeatureModule] = WORKER_MODULES

    def open_for_command(self) -> Resources:
        return open_resources(self.settings, self.worker_modules, pool_size=2)
