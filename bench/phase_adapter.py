"""Phase adapter: the product's arq adapter against arq's own ``ArqRedis.enqueue_job``, side by side.

The same N jobs (encoded once per try, outside the clock) queued, in this
process, on the run's Redis, where no worker looks (``Run.unserved``; and
none runs, but in a run that keeps its workers), five ways:

- ``arq``: arq's ``enqueue_job``, one job a call (WATCH, EXISTS, then MULTI/EXEC
  on a pinned connection: three round trips), due now;
- ``single`` and ``batch``: the adapter (``app/queue/arq_adapter.py``: one
  script call), one job a call and ``adapter_batch`` jobs a call (the recovery
  cron's page, the outbox relay's), due now, as arq's call places them;
- ``fair_single`` and ``fair_batch``: the same, each job asked for now and
  placed by its tenant's turn (100 tenants in turn), which the script reads and
  writes in the same call: the fair placement's extra cost.

Per job: wall time, CPU of this process, CPU of the Redis server (its own
``INFO cpu``, to the microsecond: a server other clients use too counts theirs).
Each try must queue every job.
Rounds alternate the order of the ways; the medians land in ``Run.results``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, cast

from app.queue.arq_adapter import DISPATCH_FUNCTION
from app.queue.arq_driver import ArqQueue
from app.queue.encoded import EncodedJob, encode_jobs, job_kwargs, namespaced
from bench.jobs import BenchItem, BenchNoopJob

if TYPE_CHECKING:
    from bench.harness import Run

TENANTS = 100
WAYS = ("arq", "single", "batch", "fair_single", "fair_batch")
Queueing = Callable[["Run", Sequence[EncodedJob]], Awaitable[int]]


async def adapter(run: Run) -> None:
    await run.fleet.release_workers()  # none polls Redis meanwhile (its CPU is measured)
    mode = run.mode
    samples: dict[str, list[tuple[float, float, float]]] = {way: [] for way in WAYS}
    for round_no in range(mode.adapter_rounds):
        for way in WAYS if round_no % 2 == 0 else tuple(reversed(WAYS)):
            samples[way].append(await _try(run, way, round_no))
    for way, tries in samples.items():
        wall, cpu, redis = (statistics.median(values) for values in zip(*tries, strict=True))
        run.results.update({f"adapter_{way}_us": wall, f"adapter_{way}_cpu_us": cpu, f"adapter_{way}_redis_us": redis})
        run.log(
            f"  {way:12s} {mode.adapter_jobs} jobs: {wall:7.1f} us per job, CPU {cpu:6.1f} us here, "
            f"{redis:6.1f} us in Redis"
        )
    results = run.results
    results.update(
        adapter_jobs=mode.adapter_jobs,
        adapter_batch=mode.adapter_batch,
        adapter_single_speedup=results["adapter_arq_us"] / results["adapter_single_us"],
        adapter_batch_speedup=results["adapter_arq_us"] / results["adapter_batch_us"],
        adapter_fair_extra_single_us=results["adapter_fair_single_us"] - results["adapter_single_us"],
        adapter_fair_extra_batch_us=results["adapter_fair_batch_us"] - results["adapter_batch_us"],
    )
    await run.drop_redis_keys()


async def _try(run: Run, way: str, round_no: int) -> tuple[float, float, float]:
    """Queue the jobs one way; returns (wall, this process's CPU, Redis' CPU) in microseconds per job."""
    count = run.mode.adapter_jobs
    await run.drop_redis_keys()
    jobs = _encode(run, f"{way}:{round_no}", count, fair=way.startswith("fair"))
    redis_before = await _redis_cpu(run)
    cpu_before, started = time.process_time(), time.perf_counter()
    queued = await QUEUEING[way](run, jobs)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_before
    redis = await _redis_cpu(run) - redis_before
    waiting = await run.redis.zcard(namespaced(run.unserved.settings, str(BenchNoopJob.queue)))
    if queued != count or waiting != count:
        raise RuntimeError(f"adapter phase, {way}: {queued} of {count} jobs queued, {waiting} waiting")
    return wall / count * 1e6, cpu / count * 1e6, redis / count * 1e6


def _encode(run: Run, tag: str, count: int, *, fair: bool) -> list[EncodedJob]:
    """``count`` no-op jobs with ids of their own: asked for now (fair, 100 tenants in turn) or due now."""
    items = [(BenchItem(id=n), f"adapter:{tag}:{n}", None) for n in range(count)]
    tenants = [f"tenant{n % TENANTS}" for n in range(count)]
    delay = None if fair else timedelta(0)  # a delay, even 0, places the job at its due time, as arq does
    return encode_jobs(run.unserved.settings, BenchNoopJob, items, delay=delay, tenant_keys=tenants)


async def _redis_cpu(run: Run) -> float:
    """CPU seconds the Redis server has used, as it counts them."""
    info = await run.redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _queue(run: Run) -> ArqQueue:
    return cast(ArqQueue, run.unserved.queue)


async def _arq(run: Run, jobs: Sequence[EncodedJob]) -> int:
    """arq's own call, one job at a time, writing what the adapter writes (the same arguments and lifetime)."""
    redis, queued = _queue(run).redis, 0
    for job in jobs:
        arq_job = await redis.enqueue_job(
            DISPATCH_FUNCTION,
            job.name,
            job.data,
            _job_id=job.job_id,
            _queue_name=namespaced(run.unserved.settings, job.queue),
            _expires=timedelta(milliseconds=job.expires_after_ms),
            **job_kwargs(job),
        )
        queued += arq_job is not None
    return queued


async def _single(run: Run, jobs: Sequence[EncodedJob]) -> int:
    queue, queued = _queue(run), 0
    for job in jobs:
        (job_id,) = await queue.enqueue_encoded([job], what=job.name)
        queued += job_id is not None
    return queued


async def _batch(run: Run, jobs: Sequence[EncodedJob]) -> int:
    queue, size, queued = _queue(run), run.mode.adapter_batch, 0
    for start in range(0, len(jobs), size):
        ids = await queue.enqueue_encoded(jobs[start : start + size], what="a batch")
        queued += sum(job_id is not None for job_id in ids)
    return queued


QUEUEING: dict[str, Queueing] = {
    "arq": _arq,
    "single": _single,
    "batch": _batch,
    "fair_single": _single,
    "fair_batch": _batch,
}
