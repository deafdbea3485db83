"""The bench's Stripe backlog phases in their smallest mode: the budget keeps under Stripe's limit, one read per
customer (thin events too; two for a customer billing never saw), every event processed, every workspace as the
Stripe stub has it, nothing left behind.

No timing is asserted (the drain ratios are reported, not checked here).
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


def test_stripe_backlogs_read_each_customer_once_and_end_as_stripe_has_it(
    base_database_url: str, redis_url: str
) -> None:
    command = [sys.executable, "-m", "bench", "--smoke", "--phases", "stripe_backlog,thin_backlog"]
    command += ["--database-url", base_database_url, "--redis-url", redis_url]
    done = subprocess.run(command, cwd=ROOT, env=child_env({}), capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert (figures["stripe_backlog_429"], figures["thin_backlog_429"]) == (0, 0), done.stderr[-2000:]
    assert figures["stripe_backlog_reads_per_customer"] == 1.0  # smoke: 200 events of 20 customers
    assert figures["thin_backlog_reads_per_customer"] == 1.0  # the same as thin events about synced subscriptions
    assert figures["thin_backlog_reads_per_customer_unknown"] == 2.0  # then 200 of 5 customers never seen
    assert (figures["stripe_backlog_mismatched"], figures["thin_backlog_mismatched"]) == (0, 0)
    for phase in ("stripe_backlog", "thin_backlog"):
        assert figures[f"{phase}_drain_ratio"] > 0 and figures[f"{phase}_worker_cpu_ms"] > 0
    notes = done.stdout.partition("Notes:")[2]
    assert "backlog" not in notes, notes  # every event processed at its first attempt
    leftovers = asyncio.run(leftovers_of(base_database_url, redis_url, figures["database"], figures["redis_namespace"]))
    assert leftovers == (0, 0)
