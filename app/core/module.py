"""What a feature module exposes: one ``MODULE`` object per feature package.

The lists of modules the API and the worker load are in ``app/runtime.py``,
the one place that knows them: the API mounts the routes of its modules and
injects their dependencies, the worker runs the jobs, crons and webhook
handlers of its own, the CLI offers the command groups of both, and Alembic
sees the models of both.

Every field is typed, so ``mypy`` checks a module's declaration. Jobs and
webhook handlers are declared above the core (``app.queue.job.Job``,
``app.webhooks.handlers``), which the core does not import: they are typed
here by the protocols they meet, and the queue checks the rest at start.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import click
from litestar.datastructures import State
from litestar.di import Provide
from litestar.types import ControllerRouterHandler

from app.core.db import Base
from app.core.settings import Settings

if TYPE_CHECKING:
    from app.core.resources import Resources


class JobClass(Protocol):
    """A job class as a module lists it: a subclass of ``app.queue.job.Job``."""

    @classmethod
    def name(cls) -> str: ...

    async def handle(self, data: Any) -> None: ...


class CronClass(JobClass, Protocol):
    """A cron class as a module lists it: a subclass of ``app.queue.job.CronJob``."""

    @classmethod
    def schedule(cls, settings: Settings) -> str: ...


WebhookHandler = Callable[[Any], Awaitable[None]]
"""Runs one inbox event, given its ``app.webhooks.handlers.WebhookContext`` (an ``EventRoutes``, or a function)."""

Retention = Callable[["Resources", datetime], Awaitable[int]]
"""``delete(resources, now)``: the module's own rows past their retention deleted in batches; how many."""


@dataclass(frozen=True)
class FeatureModule:
    name: str
    route_handlers: Sequence[ControllerRouterHandler] = ()
    """Controllers and route handlers the API mounts."""

    route_factory: Callable[[Resources], Sequence[ControllerRouterHandler]] | None = None
    """API only: ``route_factory(resources)`` returns route handlers that depend on the settings."""

    dependencies: Mapping[str, Provide] = field(default_factory=dict)
    """API only: the providers its controllers are injected with, by parameter name (``app/asgi.py`` mounts
    them on the app, where a test can replace one)."""

    jobs: Sequence[type[JobClass]] = ()
    crons: Sequence[type[CronClass]] = ()
    queues: Sequence[str] = ()
    """The queues of its own jobs, by name (``"invoices-queue"``): each is served by its own arq Worker, so they never
    wait behind another module's. Its jobs run on these or on the starter's (``app/queue/queues.py``)."""
    cli_groups: Sequence[click.Group] = ()

    webhook_handlers: Mapping[str, WebhookHandler] = field(default_factory=dict)
    """Provider name -> the handler of the events of that provider this module owns (``app.webhooks.handlers``)."""

    retention: Mapping[str, Retention] = field(default_factory=dict)
    """What the retention cron deletes besides processed events: what it is (for its log line) -> ``delete``."""

    models: Sequence[type[Base]] = ()
    """Its SQLAlchemy models: listing them here is what makes Alembic and the tests see their tables."""

    template_dirs: Sequence[Path] = ()
    """API only: folders of its Jinja templates (named from there, e.g. ``ops/overview.html.j2``)."""

    lifespan: Callable[[State, Resources], AbstractAsyncContextManager[None]] | None = None
    """API only: ``lifespan(app_state, resources)``, an async context manager run while the app serves."""
