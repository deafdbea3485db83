"""docs/models.md and docs/jobs.md, followed word for word in a copy of the project.

The copy gets the project's tracked files; then each guide's blocks are taken
in order, as a reader takes them: a ```python file=PATH block is written, a
```diff file=PATH block applied, and each line of a ```bash run block run as
the Makefile runs it, against a database made for this test. At the end
every written, edited and generated file must pass ruff and mypy. The copy,
the database and the test's Redis keys are removed at the end.
"""

from __future__ import annotations

import asyncio
import shlex
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import asyncpg
import pytest
from redis.asyncio import Redis
from sqlalchemy.engine import make_url

from app.testing.processes import child_env
from tools.doc_blocks import EXAMPLE_GUIDES, Block, Origins, apply_guide, copy_files, lint, read_blocks, tracked_files

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LITESTAR = [str(Path(sys.executable).parent / "litestar"), "--app", "app.asgi:create_app"]
COMMAND_TIMEOUT_SECONDS = 300
MYPY_CACHE = ROOT / ".mypy_cache" / "guides"


def make_variables(line: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in shlex.split(line)[2:] if "=" in word)


def make_command(line: str) -> list[str]:
    """What a guide's `make ...` line runs, as the Makefile spells it (the servers' URLs come from the test)."""
    target, variables = shlex.split(line)[:2], make_variables(line)
    if target == ["make", "migrate"]:
        return [*LITESTAR, "database", "upgrade", "--no-prompt"]
    if target == ["make", "cli"] and "ARGS" in variables:
        return [*LITESTAR, *shlex.split(variables["ARGS"])]
    if target == ["make", "test"] and "PYTEST_ARGS" in variables:
        # One file: no xdist workers to start (make test adds -n 2).
        return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *shlex.split(variables["PYTEST_ARGS"])]
    raise AssertionError(f"The guide test cannot run {line!r}: use make migrate, make cli ARGS=... or make test.")


def run_line(tree: Path, block: Block, line: str, env: Mapping[str, str]) -> None:
    command = make_command(line)
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_SECONDS)
    assert done.returncode == 0, f"{block.where}: `{line}` exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    cli_args = command[len(LITESTAR) :] if command[: len(LITESTAR)] == LITESTAR else []
    if cli_args[:2] == ["crons", "run"]:
        assert done.stdout.splitlines()[-1] == f"Cron {cli_args[2]} ran.", f"{block.where}: `{line}`:\n{done.stdout}"


def follow(tree: Path, guide: str, env: Mapping[str, str], origins: Origins) -> None:
    """Take the guide's blocks in order, recording in ``origins`` what it wrote and edited."""
    for block in read_blocks(ROOT, guide):
        if block.lang == "bash" and "run" in block.flags:
            for line in block.text.splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    run_line(tree, block, line, env)
        else:
            origins.add(apply_guide(tree, [block]), tree)


def migrations(tree: Path) -> set[str]:
    return {str(path.relative_to(tree)) for path in (tree / "alembic" / "versions").glob("*.py")}


async def _admin(url: str, statement: str) -> None:
    connection = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(False))
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


async def _drop_redis_keys(url: str, namespace: str) -> None:
    client = Redis.from_url(url)
    try:
        for pattern in (f"{namespace}*", f"arq:*:{namespace}*"):
            keys = [key async for key in client.scan_iter(match=pattern, count=1000)]
            if keys:
                await client.delete(*keys)
    finally:
        await client.aclose()


@pytest.fixture
def guide_env(base_database_url: str, redis_url: str) -> Iterator[dict[str, str]]:
    """What `make cli` would give the commands, on a database and a Redis prefix of this test only."""
    name, namespace = f"guide_{uuid.uuid4().hex[:12]}", f"guide{uuid.uuid4().hex[:8]}:"
    asyncio.run(_admin(base_database_url, f'CREATE DATABASE "{name}"'))
    url = make_url(base_database_url).set(database=name).render_as_string(hide_password=False)
    try:
        yield child_env(
            {
                "DATABASE_URL": url,
                "REDIS_URL": redis_url,
                "REDIS_NAMESPACE": namespace,
                "TEST_DATABASE_URL": base_database_url,
                "TEST_REDIS_URL": redis_url,
            }
        )
    finally:
        asyncio.run(_admin(base_database_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        asyncio.run(_drop_redis_keys(redis_url, namespace))


def test_the_models_and_jobs_guides_run_as_written(guide_env: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory(prefix="guides-") as tmp:
        tree = Path(tmp)
        copy_files(ROOT, tracked_files(ROOT), tree)
        before, origins = migrations(tree), Origins()
        for guide in EXAMPLE_GUIDES:
            follow(tree, guide, {**guide_env, "PYTHONPATH": str(tree)}, origins)

        generated = sorted(migrations(tree) - before)
        assert len(generated) == 1, f"the guides should generate one migration, not {generated}"
        assert 'op.create_table(\n        "invoice",' in (tree / generated[0]).read_text()
        origins.others.update(generated)
        assert lint(tree, origins, MYPY_CACHE) == []
