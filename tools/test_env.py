"""The servers `make test` uses: prints `TEST_DATABASE_URL=...` and `TEST_REDIS_URL=...` to export.

    python -m tools.test_env [up|down]

Each URL is, in order: the environment's value; a local server that answers within about a second
(Postgres at 127.0.0.1:5432 as user `postgres`, then `root`, database `test`, with the right to create
databases since the tests make one per session; Redis at 127.0.0.1:6379, database 15 so that a
developer's own data in database 0 is never flushed); else an embedded server under `.data/test/`,
not durable (fsync off), left running for the next `make test`. `down` stops the embedded ones.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
from typing import Any

from tools import embedded

TEST_DATA_DIR = embedded.DEFAULT_DATA_DIR / "test"
LOCAL_HOST = "127.0.0.1"
LOCAL_PG_PORT = 5432
LOCAL_REDIS_PORT = 6379
LOCAL_REDIS_DB = 15
TEST_DATABASE = "test"
PROBE_TIMEOUT = 1.0


def _say(message: str) -> None:
    print(f"test_env: {message}", file=sys.stderr, flush=True)


async def _connect(user: str, database: str) -> Any:
    import asyncpg

    return await asyncpg.connect(
        host=LOCAL_HOST, port=LOCAL_PG_PORT, user=user, database=database, timeout=PROBE_TIMEOUT
    )


async def _can_create_databases(conn: Any) -> bool:
    query = "SELECT rolsuper OR rolcreatedb FROM pg_roles WHERE rolname = current_user"
    return bool(await conn.fetchval(query))


async def _usable_as(user: str) -> bool:
    """Whether `user` reaches database `test` (creating it if the user may) and may create databases."""
    import asyncpg

    try:
        conn = await _connect(user, TEST_DATABASE)
    except asyncpg.InvalidCatalogNameError:
        conn = await _connect(user, "postgres")
        try:
            if not await _can_create_databases(conn):
                return False
            await conn.execute(f'CREATE DATABASE "{TEST_DATABASE}"')
            return True
        finally:
            await conn.close()
    try:
        return await _can_create_databases(conn)
    finally:
        await conn.close()


async def _probe_local_postgres() -> str | None:
    for user in ("postgres", "root"):
        try:
            if await _usable_as(user):
                return f"postgresql+asyncpg://{user}@{LOCAL_HOST}:{LOCAL_PG_PORT}/{TEST_DATABASE}"
        except OSError:  # refused or timed out: nothing listens, no point trying the next user
            return None
        except Exception as error:  # wrong password, no such role, ...: not usable as this user
            _say(f"local Postgres refused user {user}: {error}")
    return None


def database_url() -> str:
    """The test Postgres: environment, else a usable local server, else the embedded one."""
    if os.environ.get("TEST_DATABASE_URL"):
        return os.environ["TEST_DATABASE_URL"]
    url = asyncio.run(_probe_local_postgres())
    if url:
        _say(f"Postgres: local server at {LOCAL_HOST}:{LOCAL_PG_PORT}")
        return url
    _say(f"Postgres: embedded under {TEST_DATA_DIR}")
    return embedded.ensure_postgres(TEST_DATA_DIR, database=TEST_DATABASE, durable=False)


def redis_url() -> str:
    """The test Redis: environment, else a local server that answers PING, else the embedded one."""
    if os.environ.get("TEST_REDIS_URL"):
        return os.environ["TEST_REDIS_URL"]
    if embedded.redis_ping(LOCAL_REDIS_PORT, LOCAL_HOST, timeout=PROBE_TIMEOUT):
        _say(f"Redis: local server at {LOCAL_HOST}:{LOCAL_REDIS_PORT}, database {LOCAL_REDIS_DB}")
        return f"redis://{LOCAL_HOST}:{LOCAL_REDIS_PORT}/{LOCAL_REDIS_DB}"
    _say(f"Redis: embedded under {TEST_DATA_DIR}")
    return embedded.ensure_redis(TEST_DATA_DIR)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.test_env", description=__doc__.split("\n")[0])
    parser.add_argument("action", nargs="?", choices=["up", "down"], default="up")
    args = parser.parse_args(argv)
    if args.action == "down":
        stopped = embedded.stop_all(TEST_DATA_DIR)
        _say(f"stopped {', '.join(stopped) or 'nothing (no embedded test server was running)'}")
        return 0
    print(f"TEST_DATABASE_URL={shlex.quote(database_url())}")
    print(f"TEST_REDIS_URL={shlex.quote(redis_url())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
