"""Identity tests: Clerk events through the real pipeline, on real Postgres."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from app.core.resources import Resources
from app.core.settings import load_settings
from app.identity import module as identity
from app.runtime import open_resources


@pytest.fixture
async def clerk_worker(settings_env: dict[str, str]) -> AsyncIterator[Resources]:
    """A process that handles Clerk events (the identity module loaded), queued jobs run inline."""
    settings = load_settings({**settings_env, "MESSAGE_QUEUE_DRIVER": "sync"})
    resources = open_resources(settings, [identity.MODULE])
    yield resources
    await resources.close()
