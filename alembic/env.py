"""Alembic environment: every module's models, the URL from settings, transactional DDL.

Runs under `litestar database ...` (advanced-alchemy passes its own config with
``db_url``/``engine``) and under plain `alembic`.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import pool
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from alembic import context
from app.core.db import ALEMBIC_VERSION_TABLE, metadata
from app.core.settings import get_settings
from app.runtime import all_models

all_models()  # every module's models are imported, so their tables are in ``metadata``

config = context.config


def _url() -> str:
    url = getattr(config, "db_url", None) or config.attributes.get("db_url")
    return str(url) if url else get_settings().require_database_url()


def _configure(**kwargs: object) -> None:
    context.configure(
        target_metadata=metadata,
        version_table=ALEMBIC_VERSION_TABLE,
        compare_type=True,
        transaction_per_migration=True,
        **kwargs,  # type: ignore[arg-type]
    )


def run_offline() -> None:
    _configure(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def _run_sync(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()


async def run_online() -> None:
    engine: AsyncEngine | None = getattr(config, "engine", None)
    owned = engine is None
    if engine is None:
        engine = create_async_engine(_url(), poolclass=pool.NullPool)
    async with engine.connect() as connection:
        await connection.run_sync(_run_sync)
        await connection.commit()
    if owned:
        await engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    asyncio.run(run_online())
