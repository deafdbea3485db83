"""Plumbing for synchronous CLI commands that need the database and the queue."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from app.core.errors import exit_on_settings_error
from app.core.logging import configure_logging
from app.core.resources import Resources
from app.core.sentry import flush_sentry, init_sentry
from app.core.settings import get_settings

T = TypeVar("T")


def run_with_resources(work: Callable[[Resources], Awaitable[T]]) -> T:
    """Open the same resources the worker uses (its modules' jobs and handlers), run, close."""
    from app.worker.modules import worker_modules

    with exit_on_settings_error():
        settings = get_settings()
    configure_logging(settings)
    init_sentry(settings, "cli")

    async def main() -> T:
        resources = Resources.open(settings, pool_size=2, modules=worker_modules())
        try:
            return await work(resources)
        finally:
            await resources.close()

    try:
        return asyncio.run(main())
    finally:
        flush_sentry()
