"""Tenants of one queue served in turn: start-time fair queuing on arq's own oldest-first pick.

arq starts the due jobs of a queue oldest score first. A job asked for now is
not scored by the time it was asked for (then one tenant's bulk import of
20,000 events would hold up every other tenant until it drained) but by its
tenant's *turn*: a virtual time, in milliseconds, always in the past, so every
such job is due at once and no worker idles while work waits.

- The queue's virtual time ``V`` is the score of its oldest job (the one being
  served), or ``now - HORIZON_MS`` when it holds none older.
- A tenant's next job starts at ``max(V, F)``, where ``F`` is where its previous
  job ended; it ends one unit later (``F = start + 1``).

So a tenant with nothing queued starts at ``V``, next to the job being
served, whatever backlog another tenant has; a tenant with ``k`` jobs queued
is behind at most ``k`` jobs of each other tenant. A tenant alone gets every
slot. Retries and delayed jobs keep their real due time (``now + delay``),
which is later than every turn, so they start after the turns queued before
they became due.

The turns ``F`` of a queue's tenants are kept beside it in Redis (a sorted set,
``<queue>:fair``), trimmed to the tenants whose turn is ahead of ``V``; the
arq adapter (``app.queue.arq_adapter``) reads and writes them in the same
script that queues the job.
"""

from __future__ import annotations

HORIZON_MS = 3_600_000
"""How far in the past turns begin: a backlog of up to this many jobs (one per millisecond) is all due at once."""

ANONYMOUS_TENANT = ""
"""The tenant of jobs that name none: they share one turn."""

# A Lua function of the adapter's enqueue script: the score of a job asked for now by ``tenant``.
PLACE_BY_TURN_LUA = """
local function place_by_turn(queue, turns, tenant, now, horizon)
  local virtual = now - horizon
  local oldest = redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')
  if oldest[2] and tonumber(oldest[2]) < virtual then
    virtual = tonumber(oldest[2])
  end
  redis.call('ZREMRANGEBYSCORE', turns, '-inf', virtual)
  local start = virtual
  local ended = tonumber(redis.call('ZSCORE', turns, tenant))
  if ended and ended > start then
    start = ended
  end
  redis.call('ZADD', turns, start + 1, tenant)
  redis.call('PEXPIRE', turns, horizon * 2)
  return start
end
"""


def turns_key(queue_key: str) -> str:
    """Where a queue's tenants' turns are kept, beside the queue (``queue_key`` as Redis holds it)."""
    return f"{queue_key}:fair"
