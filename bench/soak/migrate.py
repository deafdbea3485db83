"""``python -m bench.soak.migrate DATABASE_URL``: Alembic to head, then the soak's handler-commit table."""

from __future__ import annotations

import asyncio
import sys

import asyncpg
from alembic.config import Config
from sqlalchemy.engine import make_url

from alembic import command
from bench.soak.cluster import ROOT
from bench.soak.counters import TABLE_DDL


async def _counter_table(url: str) -> None:
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(TABLE_DDL)
    finally:
        await connection.close()


def main(url: str) -> None:
    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(ROOT / "alembic"))
    config.attributes["db_url"] = url
    command.upgrade(config, "head")
    asyncio.run(_counter_table(url))


if __name__ == "__main__":
    main(sys.argv[1])
