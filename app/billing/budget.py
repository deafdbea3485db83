"""The ``stripe`` upstream: its declaration (``STRIPE_API_RATE_LIMIT_PER_SECOND`` calls a second across the fleet),
its budget, and the process's gateway that calls through it (``stripe_gateway(resources)``).

The mechanism is the queue's (``app.queue.upstreams``): the rate,
reservations, admission at the moment of a call and the pause after a 429
(``rate.py``), the outage hold and the operator's pause (``gate.py``). What is
Stripe's stays in billing: this declaration, the slots its syncs reserve per
subject (``sync.py``) and the mapping of Stripe's answers
(``stripe_gateway.py``). The budget's names are kept here for billing's code
and tests.
"""

from __future__ import annotations

from redis.asyncio import Redis

from app.billing.stripe_gateway import StripeGateway
from app.core.resources import Resources
from app.queue.job import FromSetting
from app.queue.upstreams import Upstream
from app.queue.upstreams.rate import (
    MAX_WAIT_SECONDS,
    RESERVATION_EARLY_SECONDS,
    BudgetExhaustedError,
    BudgetShortfall,
    RateBudget,
    Reservation,
    SlotLater,
)

__all__ = [
    "MAX_WAIT_SECONDS",
    "RESERVATION_EARLY_SECONDS",
    "STRIPE",
    "BudgetExhaustedError",
    "BudgetShortfall",
    "Reservation",
    "SlotLater",
    "StripeBudget",
    "stripe_budget",
    "stripe_gateway",
]


async def _stripe_answers(resources: Resources) -> None:
    """Stripe's health check: a read whatever the subject (``StripeGateway.health``)."""
    await stripe_gateway(resources).health()


STRIPE = Upstream("stripe", per_second=FromSetting("stripe_api_rate_limit_per_second"), health=_stripe_answers)


class StripeBudget(RateBudget):
    """The rate of the ``stripe`` upstream, as a process builds it (``stripe_budget(resources)`` gives the one
    its gateway uses)."""

    def __init__(self, redis: Redis, *, per_second: int, namespace: str = "") -> None:
        super().__init__(redis, name=STRIPE.name, per_second=per_second, namespace=namespace)


def stripe_budget(resources: Resources) -> RateBudget:
    """The process's share of the fleet's Stripe API budget: the ``stripe`` upstream's rate (built on first use)."""
    return STRIPE.of(resources).budget


def stripe_gateway(resources: Resources) -> StripeGateway:
    """The process's gateway, built on first use and closed with the resources (one HTTP client per process)."""
    if not resources.settings.stripe_api_key:
        # Retried, not permanent: once the key is deployed the waiting events heal by themselves.
        raise RuntimeError("Cannot read billing state from Stripe: STRIPE_API_KEY is not set. Set it.")

    def build() -> StripeGateway:
        gateway = StripeGateway(resources.settings, STRIPE.of(resources))
        resources.add_closer(gateway.close)
        return gateway

    return resources.shared(StripeGateway, build)
