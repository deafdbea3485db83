"""What a feature module exposes: one ``MODULE`` object per feature package.

The lists of modules the API and the worker load are in ``app/runtime.py``,
the one place that knows them: the API mounts the routes of its modules and
injects their dependencies, the worker runs the jobs, crons and webhook
handlers of its own, the CLI offers the command groups of both, and Alembic
sees the models of both.

What the API alone uses (routes, the providers they are injected with,
templates, a lifespan) is a module's ``ApiPart``, which its ``MODULE`` names
by import path: the worker imports every ``MODULE`` of its own, and so never
a controller, nor Litestar, which it has no use for (a third of its start-up).

Every field is typed, so ``mypy`` checks a module's declaration. Jobs,
upstreams and webhook handlers are declared above the core
(``app.queue.job.Job``, ``app.queue.upstreams.Upstream``,
``app.webhooks.handlers``), which the core does not import: they are typed
here by the protocols they meet, and the queue checks the rest at start.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import click

from app.core.db import Base
from app.core.resources import Resources
from app.core.settings import Settings

if TYPE_CHECKING:  # the API's types: the worker loads these modules too, and no Litestar
    from litestar.datastructures import State
    from litestar.di import Provide
    from litestar.types import ControllerRouterHandler

T = TypeVar("T")


class JobClass(Protocol):
    """A job class as a module lists it: a subclass of ``app.queue.job.Job``."""

    @classmethod
    def name(cls) -> str: ...

    async def handle(self, data: Any) -> None: ...


class CronClass(JobClass, Protocol):
    """A cron class as a module lists it: a subclass of ``app.queue.job.CronJob``."""

    @classmethod
    def schedule(cls, settings: Settings) -> str: ...


class UpstreamDeclaration(Protocol):
    """An upstream as a module lists it: an ``app.queue.upstreams.Upstream``."""

    @property
    def name(self) -> str: ...


WebhookHandler = Callable[[Any], Awaitable[None]]
"""Runs one inbox event, given its ``app.webhooks.handlers.WebhookContext`` (an ``EventRoutes``, or a function)."""

Retention = Callable[[Resources, datetime], Awaitable[int]]
"""``delete(resources, now)``: the module's own rows past their retention deleted in batches; how many."""


@dataclass(frozen=True)
class ApiPart:
    """A feature module's side that only the API loads: Litestar's objects, and what its routes need."""

    route_handlers: Sequence[ControllerRouterHandler] = ()
    """Controllers and route handlers the API mounts."""

    route_factory: Callable[[Resources], Sequence[ControllerRouterHandler]] | None = None
    """``route_factory(resources)`` returns route handlers that depend on the settings."""

    dependencies: Mapping[str, Provide] = field(default_factory=dict)
    """The providers its controllers are injected with, by parameter name (``app/asgi.py`` mounts them on the
    app, where a test can replace one)."""

    template_dirs: Sequence[Path] = ()
    """Folders of its Jinja templates (named from there, e.g. ``ops/overview.html.j2``)."""

    lifespan: Callable[[State, Resources], AbstractAsyncContextManager[None]] | None = None
    """``lifespan(app_state, resources)``, an async context manager run while the app serves."""


NO_API = ApiPart()


@dataclass(frozen=True)
class FeatureModule:
    name: str
    api: ApiPart | str | None = None
    """Its routes: an ``ApiPart``, or the ``package.module:NAME`` of one, which only the API imports (a
    worker loading a module whose ``MODULE`` imported a controller would load all of Litestar)."""

    jobs: Sequence[type[JobClass]] = ()
    crons: Sequence[type[CronClass]] = ()
    queues: Sequence[str] = ()
    """The queues of its own jobs, by name (``"invoices-queue"``): each is served by its own arq Worker, so they never
    wait behind another module's. Its jobs run on these or on the starter's (``app/queue/queues.py``)."""
    cli_groups: Sequence[click.Group] = ()

    upstreams: Sequence[UpstreamDeclaration] = ()
    """The external APIs its jobs call (``app.queue.upstreams.Upstream``): ``upstreams list``, ``/ops`` and the
    metrics show each, and an operator pauses one by its name."""

    webhook_handlers: Mapping[str, WebhookHandler] = field(default_factory=dict)
    """Provider name -> the handler of the events of that provider this module owns (``app.webhooks.handlers``)."""

    retention: Mapping[str, Retention] = field(default_factory=dict)
    """What the retention cron deletes besides processed events: what it is (for its log line) -> ``delete``."""

    models: Sequence[type[Base]] = ()
    """Its SQLAlchemy models: listing them here is what makes Alembic and the tests see their tables."""

    def api_part(self) -> ApiPart:
        """Its ``ApiPart``, imported now when named by path; an empty one when it has no routes."""
        if isinstance(self.api, str):
            return import_object(self.api, ApiPart, f"module {self.name!r}: api")
        return self.api or NO_API


class LoadedModules(tuple[FeatureModule, ...]):
    """The feature modules a process runs (whose jobs, webhook handlers and upstreams it knows), kept in its
    ``Resources`` by the composition root (``app.runtime.open_resources``)."""


def loaded_modules(resources: Resources) -> tuple[FeatureModule, ...]:
    """The feature modules this process runs; none when it was given none."""
    return resources.shared(LoadedModules, LoadedModules)


def import_object(path: str, kind: type[T], what: str) -> T:
    """The object ``package.module:NAME`` names, checked to be a ``kind``; a clear error otherwise."""
    module_path, _, attribute = path.partition(":")
    try:
        value = getattr(importlib.import_module(module_path), attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ImportError(f"{what} {path!r} cannot be loaded ({exc}): give it as package.module:NAME.") from exc
    if not isinstance(value, kind):
        raise TypeError(f"{what} {path!r} is a {type(value).__name__}, not a {kind.__name__}.")
    return value
