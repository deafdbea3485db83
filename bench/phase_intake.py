"""Phase 1, intake: the product's ``POST /webhooks/stripe`` against the ceiling app, then Clerk intake.

The two servers take turns at a fixed concurrency (alternating the order each
round); no worker runs meanwhile. Medians of the recorded rounds land in
``Run.results``.
"""

from __future__ import annotations

import asyncio
import statistics
from typing import TYPE_CHECKING

from bench import loadgen
from bench.deliveries import clerk_set, stripe_set
from bench.measures import cpu_seconds, profiler

if TYPE_CHECKING:
    from bench.harness import Run


async def intake(run: Run) -> None:
    mode = run.mode
    ceiling_env = {**run.env, "BENCH_CEILING_DSN": run.db_dsn}
    ceiling_env["REDIS_NAMESPACE"] = f"{run.namespace}ceiling:"
    api_task = asyncio.create_task(run.fleet.api())
    ceiling_url, ceiling = await asyncio.to_thread(
        run.processes.start_uvicorn,
        "ceiling",
        "ceiling",
        "bench.ceiling_app:create_app",
        ceiling_env,
        run.api_workers,
    )
    api_url = await api_task
    generator = "wrk" if run.use_wrk and loadgen.wrk_path() else "python"
    run.results["load_generator"] = generator
    if generator == "python" and run.use_wrk:
        run.notes.append("wrk is not installed: the intake load came from the Python client (bench/loadgen.py)")
    secret = run.env["STRIPE_WEBHOOK_SECRET"]
    cap = 12_000 if generator == "wrk" else 6_000  # deliveries per second a set is sized for
    runs: dict[str, list[loadgen.LoadResult]] = {"product": [], "ceiling": []}
    cpu: dict[str, list[float]] = {"product": [], "ceiling": []}
    servers = {"product": run.fleet.api_process(), "ceiling": ceiling}
    counter = 0

    async def measure(target: str, url: str, seconds: float, record: bool) -> None:
        nonlocal counter
        counter += 1
        signed = stripe_set(secret, int(seconds * cap) + 1000, f"{target[0]}{counter:03d}")
        lines, template = signed.write(run.directory, f"stripe-{counter}")
        server = servers[target]
        name = "api-intake" if target == "product" else "ceiling-intake"  # the same samples of both: compared
        profile = profiler(run, name, server, seconds) if record else None
        cpu_before = cpu_seconds(server)
        result = await loadgen.run_closed_loop(
            url, lines, template, seconds=seconds, connections=mode.connections, use_wrk=run.use_wrk
        )
        cpu_us = (cpu_seconds(server) - cpu_before) / max(1, result.requests) * 1e6
        if profile:
            await profile
        lines.unlink()
        if record:
            runs[target].append(result)
            cpu[target].append(cpu_us)
            run.log(
                f"  intake {target:8s} {result.rps:8.0f} req/s  p50 {result.p50_ms:6.1f} ms  "
                f"p99 {result.p99_ms:6.1f} ms  errors {result.errors}  server CPU {cpu_us:5.0f} us/request"
            )
        if result.wraps:
            run.notes.append(f"{target} intake ran out of pre-signed deliveries ({result.wraps} wraps)")

    targets = {"product": api_url, "ceiling": ceiling_url}
    for round_no in range(mode.intake_rounds):
        order = ["product", "ceiling"] if round_no % 2 == 0 else ["ceiling", "product"]
        for target in order:
            if mode.intake_warmup_seconds and round_no == 0:
                await measure(target, targets[target], mode.intake_warmup_seconds, record=False)
            await measure(target, targets[target], mode.intake_seconds, record=True)
    run.processes.stop(ceiling)

    def median(target: str, attribute: str) -> float:
        return statistics.median(getattr(result, attribute) for result in runs[target])

    product_errors = sum(result.errors for result in runs["product"])
    if product_errors:
        run.notes.append(f"{product_errors} product intake requests failed or were not answered 200")
    run.results.update(
        intake_rps=median("product", "rps"),
        intake_p50_ms=median("product", "p50_ms"),
        intake_p99_ms=median("product", "p99_ms"),
        ceiling_rps=median("ceiling", "rps"),
        ceiling_p50_ms=median("ceiling", "p50_ms"),
        ceiling_p99_ms=median("ceiling", "p99_ms"),
        intake_cpu_us=statistics.median(cpu["product"]),
        ceiling_cpu_us=statistics.median(cpu["ceiling"]),
        intake_rounds=[round(result.rps) for result in runs["product"]],
        ceiling_rounds=[round(result.rps) for result in runs["ceiling"]],
    )
    run.results["intake_ratio"] = run.results["intake_rps"] / run.results["ceiling_rps"]

    clerk = clerk_set(run.env["CLERK_WEBHOOK_SIGNING_SECRET"], int(mode.intake_seconds * cap) + 1000, "ci")
    lines, template = clerk.write(run.directory, "clerk-intake")
    result = await loadgen.run_closed_loop(
        api_url,
        lines,
        template,
        seconds=mode.intake_seconds,
        connections=mode.connections,
        use_wrk=run.use_wrk,
    )
    run.log(f"  intake clerk    {result.rps:8.0f} req/s  p50 {result.p50_ms:6.1f} ms  p99 {result.p99_ms:6.1f} ms")
    run.results.update(intake_clerk_rps=result.rps, intake_clerk_p99_ms=result.p99_ms)
    await asyncio.sleep(min(1.0, mode.intake_seconds))  # requests in flight when the load generator stopped
    await run.reset_inbox()
