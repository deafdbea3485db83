"""How the bench queues a backlog: through the product's queue, every job due at one instant (arq's own due
time, no score rewritten); jobs asked for now take their tenants' turns instead."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from app.core.resources import Resources
from app.queue.encoded import namespaced
from bench.backlog import due_in, queue_events_due, queue_now
from bench.inbox import Stored


def _run(resources: Resources) -> Any:
    return SimpleNamespace(resources=resources)


async def _scores(resources: Resources, queue: str) -> list[tuple[str, float]]:
    key = namespaced(resources.settings, queue)
    return [(member.decode(), score) for member, score in await resources.redis.zrange(key, 0, -1, withscores=True)]


async def test_a_backlog_is_queued_due_at_one_instant_ahead_in_batches(resources: Resources) -> None:
    rows = [Stored("clerk", n, f"org:o{n % 3}", f"msg_{n}") for n in range(1, 1202)]  # three batches
    due = due_in(len(rows))
    await queue_events_due(_run(resources), rows, due)

    scores = await _scores(resources, "webhook-clerk-queue")
    assert len(scores) == len(rows)
    assert {score for _, score in scores} == {due.at_ms}  # one instant, whatever the batch
    assert due.at_ms > time.time() * 1000  # ahead: none due yet
    assert await _scores(resources, "webhook-queue") == []  # each provider's job on its own queue


async def test_jobs_queued_now_take_their_tenants_turns(resources: Resources) -> None:
    flood = [Stored("clerk", n, "org:flood", f"msg_{n}") for n in range(1, 101)]
    other = Stored("clerk", 101, "org:other", "msg_101")
    await queue_now(_run(resources), [*flood, other])

    order = [member for member, _ in await _scores(resources, "webhook-clerk-queue")]
    assert len(order) == 101
    assert order.index(namespaced(resources.settings, "webhook-event:101")) <= 1  # next to the flood's first
