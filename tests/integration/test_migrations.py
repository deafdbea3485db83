"""The migrations build every table on an empty database, match the models, and roll back to empty."""

from __future__ import annotations

import asyncio

import asyncpg
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from app.core.db import ALEMBIC_VERSION_TABLE, metadata
from tests.conftest import _admin_dsn, _migrate

DOCUMENTED_TABLES = {
    "webhook_event",
    "workspace",
    "app_user",
    "workspace_member",
    "billing_dispute",
    "billing_refund",
    "billing_fraud_warning",
    "cron_run",
    "job_outbox",
}


async def _tables(url: str) -> set[str]:
    connection = await asyncpg.connect(_admin_dsn(url))
    try:
        rows = await connection.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    finally:
        await connection.close()
    return {row["tablename"] for row in rows}


def test_upgrade_matches_models_and_downgrade_empties(empty_database: str) -> None:
    _migrate(empty_database)
    assert asyncio.run(_tables(empty_database)) >= DOCUMENTED_TABLES

    assert asyncio.run(_pending_diff(empty_database)) == []

    _migrate(empty_database, "base", down=True)
    assert asyncio.run(_tables(empty_database)) <= {"alembic_versions"}


async def _pending_diff(url: str) -> list[object]:
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(url)
    try:
        async with engine.connect() as connection:
            return await connection.run_sync(
                lambda sync: compare_metadata(
                    MigrationContext.configure(
                        sync, opts={"compare_type": True, "version_table": ALEMBIC_VERSION_TABLE}
                    ),
                    metadata,
                )
            )
    finally:
        await engine.dispose()
