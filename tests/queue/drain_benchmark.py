"""How fast one worker process drains 2,000 no-op jobs (not a test: run it by hand).

    DATABASE_URL=... REDIS_URL=... .venv/bin/python -m tests.queue.drain_benchmark [--jobs 2000]

The jobs are queued first; then one ``python -m app.worker`` process (default
settings: poll 0.01 s, 20 jobs at a time, INFO logs in JSON) drains them. The
rate is jobs / (last job's end - first job's start), read from the worker's log.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

from app.core.resources import Resources
from app.core.settings import load_settings
from app.runtime import open_resources
from tests.queue.sample_jobs import NoopData, NoopJob

ROOT = Path(__file__).resolve().parents[2]


async def enqueue(resources: Resources, count: int) -> None:
    for start in range(0, count, 200):
        await asyncio.gather(
            *(resources.queue.add(NoopJob, NoopData(n=n)) for n in range(start, min(count, start + 200)))
        )


def timestamps(log: Path, prefix: str) -> list[datetime]:
    stamps = []
    for line in log.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if str(entry.get("event", "")).startswith(prefix):
            stamps.append(datetime.fromisoformat(entry["timestamp"]))
    return stamps


async def enqueue_all(env: dict[str, str], count: int) -> None:
    resources = open_resources(load_settings(env), ())
    try:
        await enqueue(resources, count)
    finally:
        await resources.close()


def main(count: int, log_level: str) -> None:
    namespace = f"bench{uuid.uuid4().hex[:8]}:"
    env = {**os.environ, "REDIS_NAMESPACE": namespace, "LOG_FORMAT": "json", "LOG_LEVEL": log_level}
    asyncio.run(enqueue_all(env, count))
    log = Path(tempfile.mkstemp(suffix=".log")[1])
    command = [
        sys.executable,
        "-m",
        "app.testing.worker",
        "--module",
        "tests.queue.sample_jobs:MODULE",
        "--queues",
        "default-queue",
    ]
    with log.open("wb") as out:
        worker = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    started = time.monotonic()
    try:
        while len(timestamps(log, "Job NoopJob finished")) < count and time.monotonic() - started < 300:
            time.sleep(0.2)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    starts, ends = timestamps(log, "Job NoopJob started"), timestamps(log, "Job NoopJob finished")
    seconds = (max(ends) - min(starts)).total_seconds()
    print(f"{len(ends)} no-op jobs drained by one worker in {seconds:.2f} s: {len(ends) / seconds:.0f} jobs/s")
    log.unlink()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args()
    main(args.jobs, args.log_level)
