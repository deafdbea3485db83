"""The soak's short version in the suite, so CI guards the promise: nothing lost, nothing applied twice.

A few hundred signed deliveries through 2 API and 2 worker processes on this
run's own embedded Postgres and Redis, while each fault of the schedule happens
once (``bench/soak/faults.py``) and the endpoint outage drops some deliveries
for good (``bench/soak/outage.py``: brought back by the backfill and the
reconciliations). It runs ``python -m bench.soak --short`` as
``make soak`` does, so what CI checks is the command a developer runs.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import embedded_servers_folder
from tools import embedded

ROOT = Path(__file__).resolve().parents[2]
FAULTS = (
    "Postgres restart",
    "SIGKILL worker",
    "Stripe stub outage",
    "Redis restart",
    "SIGTERM worker",
    "endpoint outage",
)
TIME_LIMIT_SECONDS = 300  # about a minute and a half, more on a busy machine


@pytest.mark.slow(100)
def test_short_soak_loses_nothing_and_applies_nothing_twice(tmp_path: Path) -> None:
    run_parent = embedded_servers_folder("soak-short-")
    summary_file, run_dir = tmp_path / "summary.json", run_parent / "run"
    command = [sys.executable, "-m", "bench.soak", "--short", "--run-dir", str(run_dir)]
    command += ["--json-out", str(summary_file)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = process.communicate(timeout=TIME_LIMIT_SECONDS)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)  # the soak stops its processes and servers on SIGTERM
        output, _ = process.communicate(timeout=60)
        pytest.fail(f"the short soak ran over {TIME_LIMIT_SECONDS} s:\n{output[-6000:]}")
    finally:
        if process.poll() is None:
            process.kill()
        embedded.stop_all(run_dir / "data")  # in case the soak itself died
        if process.returncode == 0:
            shutil.rmtree(run_parent, ignore_errors=True)  # on failure the soak keeps its logs there
    assert summary_file.exists(), output[-6000:]
    summary = json.loads(summary_file.read_text())
    assert summary["lost"] == 0, output[-6000:]
    # The endpoint outage dropped deliveries of both providers, and each was brought back (else it counts as lost).
    assert summary["dropped"]["stripe"] > 0 and summary["dropped"]["clerk"] > 0, output[-6000:]
    assert summary["dropped_lost"] == 0, output[-6000:]
    assert summary["applied_twice"] == 0, output[-6000:]
    assert summary["faults"] == {name: 1 for name in FAULTS}, output[-6000:]
    assert summary["faults_ok"], output[-6000:]
    assert summary["set_aside"] == summary["meant_to_fail"] == summary["alerts_ok"] > 0, output[-6000:]
    assert summary["problems"] == [], output[-6000:]
    assert process.returncode == 0, output[-6000:]
