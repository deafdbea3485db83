"""``make bench [BENCH_ARGS=--full]``: see bench/README.md.

Quick mode (default) takes about ten minutes, ``--full`` about an hour (most of
it the isolation and fairness floods of 20,000 events), ``--smoke`` (the smoke
test's) a minute or two. The last line printed is one JSON object; ``--full``
also writes the table to ``bench/results/latest.md``."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from bench import (
    loadgen,
    phase_adapter,
    phase_crons,
    phase_fairness,
    phase_intake,
    phase_isolation,
    phase_journal,
    phase_metrics_cost,
    phase_outage,
    phase_pipeline,
    phase_stripe_backlog,
    phase_thin_backlog,
    phase_timeline,
    phase_tracing_cost,
)
from bench.harness import DEFAULT_DATABASE_URL, DEFAULT_REDIS_URL, ROOT, Run
from bench.modes import MODES, Mode
from bench.report import json_line, table

PHASES: dict[str, Callable[[Run], Awaitable[None]]] = {
    "intake": phase_intake.intake,
    "pipeline": phase_pipeline.pipeline,
    "drain": phase_journal.drain,  # the drain phase, then the journal's cost to a Clerk worker
    "crons": phase_crons.crons,
    "adapter": phase_adapter.adapter,
    "stripe_backlog": phase_stripe_backlog.stripe_backlog,
    "thin_backlog": phase_thin_backlog.thin_backlog,
    "outage": phase_outage.outage,
    "isolation": phase_isolation.isolation,
    "fairness": phase_fairness.fairness,
    "metrics_cost": phase_metrics_cost.metrics_cost,
    "tracing_cost": phase_tracing_cost.tracing_cost,
    "timeline": phase_timeline.timeline,
}


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _git_revision() -> str:
    try:
        revision = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "app"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        return revision + ("+local changes in app/" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


async def _main(run: Run, phases: list[str]) -> None:
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if task is not None:
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
    async with run.session():
        for phase in phases:
            _log(f"{phase}:")
            started = time.perf_counter()
            await PHASES[phase](run)
            _log(f"  ({time.perf_counter() - started:.0f} s)")
        run.results["api_rss_mb"] = run.processes.peak_rss_mb("api")
        run.results["worker_rss_mb"] = run.processes.peak_rss_mb("worker")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--full", action="store_const", dest="mode", const="full", help="the long run (issue figures)")
    size.add_argument("--smoke", action="store_const", dest="mode", const="smoke", help="seconds: the smoke test's")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated subset of {', '.join(PHASES)}")
    parser.add_argument("--no-wrk", action="store_true", help="use the Python load generator even if wrk is there")
    parser.add_argument("--api-workers", type=int, default=1, help="uvicorn processes, product and ceiling alike")
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL") or DEFAULT_DATABASE_URL)
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL") or DEFAULT_REDIS_URL)
    parser.add_argument("--keep", action="store_true", help="keep the run directory (process logs)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="py-spy the API during intake, a worker during drains (keeps the run directory)",
    )
    parser.add_argument(
        "--baseline-tree",
        metavar="DIR",
        help="a checkout of the product before tracing (git worktree add DIR <commit>): tracing_cost also measures "
        "tracing off against it",
    )
    parser.add_argument("--no-write", action="store_true", help="with --full: do not update bench/results/latest.md")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a mode field, e.g. --set intake_rounds=3 --set drain_events=5000 (see MODES in bench/modes.py)",
    )
    args = parser.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a Stripe stub's logging set-up would log every request
    mode = MODES[args.mode or "quick"]
    overrides: dict[str, Any] = {}
    for item in args.set:
        name, _, value = item.partition("=")
        if name not in {field.name for field in dataclasses.fields(Mode)} or name == "name":
            parser.error(f"--set {item!r}: no mode field {name!r}")
        current = getattr(mode, name)
        if isinstance(current, bool):
            overrides[name] = value.lower() in ("1", "true", "yes")
        else:
            overrides[name] = tuple(value.split(",")) if isinstance(current, tuple) else type(current)(value)
    mode = dataclasses.replace(mode, **overrides)
    phases = [phase.strip() for phase in args.phases.split(",") if phase.strip()]
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        parser.error(f"unknown phase(s) {', '.join(unknown)}: use some of {', '.join(PHASES)}")

    load_before = os.getloadavg()
    _log(
        f"bench {mode.name}: {os.cpu_count()} cores, load average {load_before[0]:.2f}; "
        f"load generator {'wrk' if loadgen.wrk_path() and not args.no_wrk else 'python (bench/loadgen.py)'}"
    )
    run = Run(
        mode,
        database_url=args.database_url,
        redis_url=args.redis_url,
        use_wrk=not args.no_wrk,
        api_workers=args.api_workers,
        keep=args.keep,
        profile=args.profile,
        baseline_tree=args.baseline_tree,
        log=_log,
    )
    started = time.perf_counter()
    try:
        asyncio.run(_main(run, phases))
    except (KeyboardInterrupt, asyncio.CancelledError):
        _log("interrupted: processes stopped, database and Redis keys dropped")
        raise SystemExit(130) from None
    load_after = os.getloadavg()
    run.results.update(
        mode=mode.name,
        seconds=round(time.perf_counter() - started, 1),
        load_before=round(load_before[0], 2),
        load_after=round(load_after[0], 2),
    )
    header = (
        f"`make bench{' BENCH_ARGS=--' + mode.name if mode.name != 'quick' else ''}` on "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {_git_revision()}, {os.cpu_count()} cores "
        f"({platform.processor() or platform.machine()}), load average {load_before[0]:.2f} before / "
        f"{load_after[0]:.2f} after, load generator {run.results.get('load_generator', 'n/a')}, "
        f"{run.api_workers} API process(es), {run.results['seconds']:.0f} s."
    )
    text = table(run.results, header)
    if run.notes:
        text += "\n\nNotes:\n" + "\n".join(f"- {note}" for note in run.notes)
    print(text)
    if mode.name == "full" and not args.no_write and phases == list(PHASES):
        (ROOT / "bench" / "results" / "latest.md").write_text(text + "\n")
        print("\n(written to bench/results/latest.md)")
    print(json_line(run.results), flush=True)


if __name__ == "__main__":
    main()
