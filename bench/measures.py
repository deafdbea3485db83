"""What the phases measure with: percentiles, CPU time of processes, and py-spy under ``--profile``."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from bench.processes import Managed

if TYPE_CHECKING:
    from bench.harness import Run


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


def service_cpu_seconds() -> dict[str, float]:
    """CPU seconds used so far by the Postgres and Redis servers on this machine (all their processes)."""
    totals = {"postgres": 0.0, "redis": 0.0}
    for process in psutil.process_iter(["name"]):
        name = process.info["name"] or ""
        service = "postgres" if name.startswith("postgres") else "redis" if name.startswith("redis-server") else None
        if service is None:
            continue
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            totals[service] += times.user + times.system
    return totals


def cpu_seconds(managed: Managed) -> float:
    """User + system CPU time of a process and its children (uvicorn --workers)."""
    total = 0.0
    for pid in managed.pids():
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


def profiler(run: Run, name: str, managed: Managed | None, seconds: float | None) -> asyncio.Task[None] | None:
    """``--profile``: py-spy (if installed) on one process while a phase runs; flame graph in the run dir."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not run.profile or managed is None or not os.path.exists(py_spy):
        return None
    output = run.directory / f"profile-{name}.txt"
    command = [py_spy, "record", "--pid", str(managed.process.pid), "--format", "raw", "-o", str(output)]
    command += ["--rate", "200", "--nonblocking"]
    if seconds:
        command += ["--duration", str(max(1, int(seconds)))]

    async def record() -> None:
        process = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        try:
            await process.wait()
        except asyncio.CancelledError:
            process.send_signal(2)
            await process.wait()
        run.notes.append(f"py-spy profile of {managed.name}: {output}")

    return asyncio.create_task(record())
