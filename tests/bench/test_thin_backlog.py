"""The bench's thin_backlog phase in its smallest mode: thin events about subscriptions billing synced cost one read
per customer, about customers never seen two, under Stripe's limit, and every workspace ends as the stub has it.

No timing is asserted (the drain ratio is reported, not checked here).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from app.testing.processes import child_env
from tests.bench.test_bench_smoke import leftovers_of
from tests.processes import ROOT

pytestmark = pytest.mark.slow


def test_thin_backlog_reads_each_customer_once_and_a_never_seen_one_twice(
    base_database_url: str, redis_url: str
) -> None:
    command = [sys.executable, "-m", "bench", "--smoke", "--phases", "thin_backlog"]
    command += ["--database-url", base_database_url, "--redis-url", redis_url]
    done = subprocess.run(command, cwd=ROOT, env=child_env({}), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["thin_backlog_429"] == 0, done.stderr[-2000:]
    assert figures["thin_backlog_reads_per_customer"] == 1.0  # smoke: 200 events of 20 customers
    assert figures["thin_backlog_reads_per_customer_unknown"] == 2.0  # then 200 events of 5 never seen
    assert figures["thin_backlog_mismatched"] == 0
    assert figures["thin_backlog_drain_ratio"] > 0 and figures["thin_backlog_worker_cpu_ms"] > 0
    notes = done.stdout.partition("Notes:")[2]
    assert "thin backlog" not in notes, notes  # every event processed at its first attempt
    leftovers = asyncio.run(leftovers_of(base_database_url, redis_url, figures["database"], figures["redis_namespace"]))
    assert leftovers == (0, 0)
