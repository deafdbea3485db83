"""The ``stripe`` upstream: its declaration (``STRIPE_API_RATE_LIMIT_PER_SECOND`` calls a second across the fleet)
and its budget.

The mechanism is the queue's (``app.queue.upstreams``): the rate, turns,
admission at the moment of a call and the pause after a 429 (``rate.py``), the
outage hold and the operator's pause (``gate.py``). What is Stripe's stays in
billing: this declaration, the turns its syncs reserve per subject
(``sync.py``) and the mapping of Stripe's answers (``stripe_gateway.py``). The
budget's names are kept here for billing's code and tests.
"""

from __future__ import annotations

from redis.asyncio import Redis

from app.core.resources import Resources
from app.queue.job import FromSetting
from app.queue.upstreams import Upstream
from app.queue.upstreams.rate import (
    MAX_WAIT_SECONDS,
    TURN_EARLY_SECONDS,
    BudgetExhaustedError,
    BudgetShortfall,
    RateBudget,
    Turn,
    TurnLater,
)

__all__ = [
    "MAX_WAIT_SECONDS",
    "STRIPE",
    "TURN_EARLY_SECONDS",
    "BudgetExhaustedError",
    "BudgetShortfall",
    "StripeBudget",
    "Turn",
    "TurnLater",
]


async def _stripe_answers(resources: Resources) -> None:
    """Stripe's health check: a read whatever the subject (``StripeGateway.health``)."""
    from app.billing.stripe_gateway import stripe_gateway  # the gateway builds on this module: imported when used

    await stripe_gateway(resources).health()


STRIPE = Upstream("stripe", per_second=FromSetting("stripe_api_rate_limit_per_second"), health=_stripe_answers)


class StripeBudget(RateBudget):
    """The rate of the ``stripe`` upstream, as a process builds it (``stripe_budget(resources)`` gives the one
    its gateway uses)."""

    def __init__(self, redis: Redis, *, per_second: int, namespace: str = "") -> None:
        super().__init__(redis, name=STRIPE.name, per_second=per_second, namespace=namespace)
