"""What a feature module exposes: one ``MODULE`` object per feature package.

The API mounts the controllers of the modules its factory lists; the worker
loads the jobs and crons of the modules listed in ``app/worker/modules.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

import click


@dataclass(frozen=True)
class FeatureModule:
    name: str
    route_handlers: Sequence[Any] = ()
    # API only: ``route_factory(resources)`` returns route handlers that depend on the settings
    route_factory: Callable[[Any], Sequence[Any]] | None = None
    jobs: Sequence[type[Any]] = ()
    crons: Sequence[type[Any]] = ()
    cli_groups: Sequence[click.Group] = ()
    # provider name -> async handler(context) of the webhook events that module owns
    webhook_handlers: Mapping[str, Any] = field(default_factory=dict)
    # API only: ``lifespan(app_state, resources)``, an async context manager run while the app serves
    lifespan: Callable[[Any, Any], AbstractAsyncContextManager[None]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
