"""``python -m bench.soak [--events N] [--short] [--json-out FILE]``: one soak and chaos run.

Starts its own embedded Postgres and Redis (own ports, own data folder under a
temporary run folder), migrates, starts the Stripe, Clerk and Sentry stubs, 2 API
and 2 worker processes; plays the plan (``plan.py``) through the load loop while
the fault schedule (``faults.py``) runs and the endpoint outage (``outage.py``)
drops deliveries; waits for the pipeline to drain; backfills and reconciles;
checks (``verify.py``); prints one table. Exit 0 only when nothing was lost, nothing
applied twice and every other check held. The run folder (logs, data) is kept
on failure or with ``--keep``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from app.testing.deliveries import generate_whsec
from bench.soak.clerk_state import ClerkControl
from bench.soak.cluster import ROOT, Cluster
from bench.soak.config import DEFAULT_EVENTS, SoakConfig
from bench.soak.faults import Faults
from bench.soak.load import Sender
from bench.soak.outage import EndpointOutage
from bench.soak.plan import build_plan
from bench.soak.recovery import RecoveryPasses
from bench.soak.report import RunResult, Summary, summary, table
from bench.soak.runtime import Db, Driver, StubControl
from bench.soak.verify import Verifier


def say(message: str) -> None:
    print(f"soak: {message}", flush=True)


async def soak(config: SoakConfig, run_dir: Path) -> RunResult:
    secrets = {"stripe": generate_whsec(), "clerk": generate_whsec()}
    cluster = Cluster(config, run_dir, secrets)
    started = time.monotonic()
    db: Db | None = None
    sender: Sender | None = None
    stub: StubControl | None = None
    clerk: ClerkControl | None = None
    passes: RecoveryPasses | None = None
    try:
        say(f"run folder {run_dir}")
        await asyncio.to_thread(cluster.start_servers)
        say(f"Postgres on :{cluster.pg_port}, Redis on :{cluster.redis_port} (embedded, this run's own)")
        await asyncio.to_thread(cluster.migrate)
        await asyncio.to_thread(cluster.start_stubs)
        await asyncio.to_thread(cluster.start_apps)
        say(
            f"2 API processes ({', '.join(cluster.api_urls)}), 2 workers, Stripe stub {cluster.stripe_url}, "
            f"Clerk stub {cluster.clerk_url}: ready after {time.monotonic() - started:.1f} s"
        )
        plan = build_plan(config)
        outage = EndpointOutage(config, random.Random(config.seed + 2))
        say(
            f"plan: {plan.planned_deliveries:,} deliveries of {sum(1 for _ in plan.events()):,} distinct events "
            f"over {config.send_seconds:.0f} s; faults from 10% of it on (Postgres, Redis, SIGKILL, Stripe, SIGTERM); "
            f"deliveries dropped from {outage.window[0]:.0f} to {outage.window[1]:.0f} s (endpoint outage)"
        )
        rng = random.Random(config.seed + 1)
        sender = Sender(config, cluster.api_urls, secrets, rng)
        stub = StubControl(cluster)
        db = Db(cluster.database_url)
        await db.open()
        clerk = ClerkControl(cluster.clerk_url, plan)
        driver = Driver(plan, sender, (stub, clerk), outage, db, rng)
        faults = Faults(config, cluster, stub, driver)
        driver.origin = time.monotonic()
        fault_task = asyncio.create_task(faults.run())
        span = config.send_seconds
        # Once Redis is back (the limiter fails open while it is down), over a quarter of the sending time.
        noisy_task = asyncio.create_task(sender.noisy(0.30 * span, 0.25 * span, driver))
        await driver.run()
        await noisy_task
        if not await sender.wait_idle(config.resend_deadline_seconds + 30):
            say("some deliveries were still being re-sent at the deadline")
        await fault_task
        say(f"sent everything after {driver.now():.0f} s, the faults are over; draining")
        verifier = Verifier(config, plan, sender, cluster, db, clerk)
        passes = RecoveryPasses(cluster)
        drained = await verifier.drain(config.drain_timeout_seconds, passes.when_idle)
        at = driver.now()
        say(f"{at:.0f} s: after the endpoint outage, the backfill and both reconciliations")

        async def settle() -> float | None:
            """The backfilled events processed; the Clerk rows as the webhooks alone left them."""
            seconds = await verifier.drain(config.drain_timeout_seconds, passes.when_idle if passes else None)
            await verifier.snapshot_clerk()
            return seconds

        repaired = await outage.repair(cluster, settle)
        faults.records.append(outage.record(at, repaired, cluster.sentry_file))
        findings = await verifier.check(drained)
        text = table(config, findings, sender.stats, faults.records)
        print(text, flush=True)
        return {
            **summary(config, findings, sender.stats, faults.records),
            "table": text,
            "total_seconds": round(time.monotonic() - started, 1),
        }
    finally:
        for closing in (sender, stub, clerk, db, passes):
            if closing is not None:
                with contextlib.suppress(Exception):
                    await closing.close()
        await asyncio.to_thread(cluster.stop)


def markdown(config: SoakConfig, result: RunResult, load_before: float) -> str:
    """The table with what produced it: the results file of a full run."""
    try:
        revision = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        revision = "unknown"
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = "make soak" if config.events == DEFAULT_EVENTS else f"make soak EVENTS={config.events}"
    if config.short:
        command = "python -m bench.soak --short"
    problems = "\n".join(f"- {p}" for p in result["problems"]) or "none"
    return (
        f"# Soak and chaos run\n\n`{command}` (`python -m bench.soak`), {when}, revision {revision}, "
        f"{os.cpu_count()} cores (load average {load_before:.1f} at the start), "
        f"{result['total_seconds']} s in all.\n\n{result['table']}\n\nProblems: {problems}\n"
    )


def failed(result: Summary) -> bool:
    return bool(result["lost"] or result["applied_twice"] or result["problems"] or not result["faults_ok"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, help="deliveries to send (default 10,000; --short: 400)")
    parser.add_argument("--rate", type=float, help="deliveries per second on average (default 40; --short: 16)")
    parser.add_argument("--short", action="store_true", help="the test suite's version: a few hundred events")
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument("--run-dir", type=Path, help="logs and data here (default: a new temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the run folder even when the run passes")
    parser.add_argument("--json-out", type=Path, help="also write the summary as JSON here")
    parser.add_argument("--markdown-out", type=Path, help="also write the table (markdown) here")
    args = parser.parse_args(argv)
    overrides: dict[str, object] = {"seed": args.seed}
    if args.events:
        overrides["events"] = args.events
    if args.rate:
        overrides["rate"] = args.rate
    config = SoakConfig.short_run(**overrides) if args.short else SoakConfig(**overrides)  # type: ignore[arg-type]
    load_before = os.getloadavg()[0]
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="soak-"))
    run_dir.mkdir(parents=True, exist_ok=True)

    async def run() -> RunResult:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        if task is not None:
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
        return await soak(config, run_dir)

    try:
        result = asyncio.run(run())
    except (KeyboardInterrupt, asyncio.CancelledError):
        say(f"interrupted; servers stopped, logs kept in {run_dir}")
        return 130
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2, default=str))
    if args.markdown_out:
        args.markdown_out.write_text(markdown(config, result, load_before))
    bad = failed(result)
    for problem in result["problems"]:
        say(f"PROBLEM: {problem}")
    if bad or args.keep:
        say(f"logs and data kept in {run_dir}")
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
    say(
        f"{'FAILED' if bad else 'passed'}: lost {result['lost']}, applied twice {result['applied_twice']}, "
        f"{len(result['problems'])} problems, {result['total_seconds']} s"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
