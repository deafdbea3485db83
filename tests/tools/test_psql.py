"""`make psql`: a psql shell on the development database, given by DATABASE_URL or the embedded one."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `tools` is not an installed package: it runs from the checkout
    sys.path.insert(0, str(ROOT))

from tools import embedded, psql  # noqa: E402


def run_psql(env: dict[str, str], sql: str) -> subprocess.CompletedProcess[str]:
    """`make psql SQL="..."` as its recipe runs it: make exports a variable given on its command line."""
    environment = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    return subprocess.run(
        [sys.executable, "-m", "tools.psql"],
        cwd=ROOT,
        env={**environment, **env, "SQL": sql},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_make_target_runs_the_tool() -> None:
    recipe = subprocess.run(["make", "-n", "-s", "psql"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert recipe.stdout.splitlines()[-1] == ".venv/bin/python -m tools.psql"


def test_the_url_reaches_psql_through_libpq_variables_and_the_password_stays_off_the_command_line() -> None:
    url = "postgresql+asyncpg://saas:s3cret-pass@db.internal:6543/saas?ssl=require"
    assert psql.libpq_environment(url) == {
        "PGHOST": "db.internal",
        "PGPORT": "6543",
        "PGUSER": "saas",
        "PGPASSWORD": "s3cret-pass",
        "PGDATABASE": "saas",
        "PGSSLMODE": "require",
    }
    assert psql.libpq_environment("postgresql://postgres@127.0.0.1/app") == {
        "PGHOST": "127.0.0.1",
        "PGUSER": "postgres",
        "PGDATABASE": "app",
    }
    assert not any("s3cret" in word for word in psql.command([], "SELECT 1"))


@pytest.mark.parametrize(
    ("url", "said"),
    [("not a url", "is not a database URL"), ("mysql://root@localhost/app", "psql reaches only Postgres")],
)
def test_a_url_psql_cannot_use_is_refused_with_what_to_do(url: str, said: str) -> None:
    done = run_psql({"DATABASE_URL": url}, "SELECT 1")
    assert done.returncode == 1
    assert done.stderr.startswith("make psql: ") and said in done.stderr


def test_with_database_url_it_queries_that_database(database_url: str) -> None:
    done = run_psql({"DATABASE_URL": database_url}, "SELECT current_database() AS db, 2 + 3 AS five")
    assert done.returncode == 0, done.stderr
    database = database_url.rsplit("/", 1)[1].split("?")[0]
    assert [line.split("|") for line in done.stdout.splitlines()[2:3]] == [[f" {database} ", "    5"]]


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    embedded.stop_all(tmp_path)


@pytest.mark.slow
def test_without_database_url_it_starts_the_embedded_postgres_and_leaves_it_running(data_dir: Path) -> None:
    done = run_psql({"DEV_DATA_DIR": str(data_dir)}, "SELECT current_database()")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[2].strip() == "app"  # the development database, as `make cli` uses it
    assert embedded._running_postgres(data_dir / "postgres") is not None  # as after `make cli`
