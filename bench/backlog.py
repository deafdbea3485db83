"""Backlogs held back and released at once: what the drain phases time.

A backlog's jobs are queued an hour in the future, so workers can be started
(and seen polling) while none of them is due; ``release`` then makes every one
due at the same instant, which is when the clock starts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.harness import Run

HELD_BACK = timedelta(hours=1)  # backlog jobs are queued this far in the future, then released at once

# Sets every queued job of a queue due now (score 0 would read as "finished" to arq).
_RELEASE_LUA = """
local members = redis.call('ZRANGE', KEYS[1], 0, -1)
for i = 1, #members do redis.call('ZADD', KEYS[1], ARGV[1], members[i]) end
return #members
"""


async def enqueue_held_back(
    run: Run, job_cls: Any, items: Sequence[Any], ids: Callable[[Any], str | None], *, chunk: int = 50
) -> None:
    """Queue one job per item, due only after ``HELD_BACK``; every one must be queued (none deduplicated away)."""
    for start in range(0, len(items), chunk):
        part = items[start : start + chunk]
        added = await asyncio.gather(
            *(run.resources.queue.add(job_cls, item, deduplication_id=ids(item), delay=HELD_BACK) for item in part)
        )
        if any(job_id is None for job_id in added):
            raise RuntimeError(f"{job_cls.name()}: a backlog job was not queued")


async def release(run: Run) -> float:
    """Make every held-back job due now; returns when that happened (perf_counter)."""
    started = time.perf_counter()
    now_ms = int(time.time() * 1000)
    await run.redis.eval(_RELEASE_LUA, 1, run.queue_key, str(now_ms))  # type: ignore[misc]
    return started
