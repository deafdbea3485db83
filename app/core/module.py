"""What a feature module exposes: one ``MODULE`` object per feature package.

The lists of modules the API and the worker load are in ``app/runtime.py``,
the one place that knows them: the API mounts the routes of its modules, the
worker runs the jobs, crons and webhook handlers of its own, the CLI offers the
command groups of both, and Alembic sees the models of both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click


@dataclass(frozen=True)
class FeatureModule:
    name: str
    route_handlers: Sequence[Any] = ()
    """Controllers and route handlers the API mounts."""

    route_factory: Callable[[Any], Sequence[Any]] | None = None
    """API only: ``route_factory(resources)`` returns route handlers that depend on the settings."""

    jobs: Sequence[type[Any]] = ()
    crons: Sequence[type[Any]] = ()
    cli_groups: Sequence[click.Group] = ()

    webhook_handlers: Mapping[str, Any] = field(default_factory=dict)
    """Provider name -> the handler of the events of that provider this module owns (``app.webhooks.handlers``)."""

    models: Sequence[type[Any]] = ()
    """Its SQLAlchemy models: listing them here is what makes Alembic and the tests see their tables."""

    template_dirs: Sequence[Path] = ()
    """API only: folders of its Jinja templates (named from there, e.g. ``ops/overview.html.j2``)."""

    lifespan: Callable[[Any, Any], AbstractAsyncContextManager[None]] | None = None
    """API only: ``lifespan(app_state, resources)``, an async context manager run while the app serves."""
