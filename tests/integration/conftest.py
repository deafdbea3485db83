"""A database of its own for a migration test, empty: migrated step by step by the test."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from tests.conftest import create_database, drop_database


@pytest.fixture
def empty_database(base_database_url: str) -> Iterator[str]:
    name = f"test_mig_{uuid.uuid4().hex[:10]}"
    url = asyncio.run(create_database(base_database_url, name))
    yield url
    asyncio.run(drop_database(base_database_url, name))
