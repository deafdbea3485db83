"""Upstreams: the external APIs jobs call, each declared once, shared by the whole fleet through Redis.

A module declares one in a line (``EMAIL = Upstream("email", per_second=10)``)
and lists it in its ``MODULE`` (``upstreams=[EMAIL]``); a job makes each call
inside ``async with EMAIL.call(self.resources, subject=...)``. Every call of
every worker, command and cron then passes

- its rate (``rate.py``): at most ``per_second`` calls in any second across
  the fleet, with no burst;
- its gate (``gate.py``): the outage hold, an operator's pause, the cap on
  calls in flight;

and is counted (``calls.py``: ``upstream_calls_total``,
``upstream_wait_seconds``). A job that must wait is told so by an
``UpstreamWait`` (``waits.py``): it comes back later holding nothing and
spending no attempt. docs/jobs.md shows a job calling its own upstream;
docs/operations.md what an outage and a pause look like.
"""

from app.queue.upstreams.calls import Call, UpstreamCalls
from app.queue.upstreams.declaration import Upstream, declared_upstreams
from app.queue.upstreams.gate import GateStatus
from app.queue.upstreams.waits import UpstreamBusy, UpstreamHeld, UpstreamPaused, UpstreamWait

__all__ = [
    "Call",
    "GateStatus",
    "Upstream",
    "UpstreamBusy",
    "UpstreamCalls",
    "UpstreamHeld",
    "UpstreamPaused",
    "UpstreamWait",
    "declared_upstreams",
]
