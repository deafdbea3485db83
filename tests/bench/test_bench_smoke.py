"""The benchmark harness end to end in its smallest mode: it reports every figure and leaves nothing behind.

No timing is asserted: the bench reports, the tests check behaviour.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import asyncpg
import pytest
from redis.asyncio import Redis
from sqlalchemy.engine import make_url

from app.testing.processes import child_env
from bench.report import REQUIRED_KEYS
from tests.processes import ROOT

pytestmark = pytest.mark.slow(60)  # about a minute on 2 cores: make test starts it among the first


async def leftovers_of(database_url: str, redis_url: str, database: str, namespace: str) -> tuple[int, int]:
    connection = await asyncpg.connect(make_url(database_url).set(drivername="postgresql").render_as_string(False))
    try:
        databases = await connection.fetchval("SELECT count(*) FROM pg_database WHERE datname = $1", database)
    finally:
        await connection.close()
    redis = Redis.from_url(redis_url)
    try:
        keys = [key async for key in redis.scan_iter(match=f"*{namespace}*", count=1000)]
    finally:
        await redis.aclose()
    return databases, len(keys)


def test_smoke_run_prints_every_figure_and_cleans_up(base_database_url: str, redis_url: str) -> None:
    command = [sys.executable, "-m", "bench", "--smoke", "--database-url", base_database_url, "--redis-url", redis_url]
    done = subprocess.run(command, cwd=ROOT, env=child_env({}), capture_output=True, text=True, timeout=360)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    missing = [key for key in REQUIRED_KEYS if figures.get(key) is None]
    assert not missing, f"no figure for {missing}:\n{done.stdout}\n{done.stderr[-2000:]}"
    assert figures["mode"] == "smoke" and figures["load_generator"] in ("wrk", "python")
    leftovers = asyncio.run(leftovers_of(base_database_url, redis_url, figures["database"], figures["redis_namespace"]))
    assert leftovers == (0, 0)
