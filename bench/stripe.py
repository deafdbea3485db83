"""The run's Stripe: the test kit's stub (a thread of the harness) that every process of the run reads.

Every worker reads Stripe through the fleet's budget of ``BUDGET_PER_SECOND``
calls; the stripe_backlog phase has the stub refuse (429) past
``STUB_LIMIT_PER_SECOND`` in any second, as Stripe would.
"""

from __future__ import annotations

import copy
from typing import Any

from app.testing.stripe_stub import StripeStub

BUDGET_PER_SECOND = 20  # STRIPE_API_RATE_LIMIT_PER_SECOND of the workers
STUB_LIMIT_PER_SECOND = 25  # what the stub lets through, like Stripe's own limit above the budget
_ENDED = frozenset({"canceled", "incomplete_expired"})


class BacklogStripeStub(StripeStub):
    """The test kit's stub, finding a customer's subscriptions before copying them.

    The kit's ``_expanded_customer`` deep-copies every stored subscription on each
    expanded read (about 0.25 s per read with 1,000 customers), which would make the
    stub, not the budget, what the drain waits for. Same answers, found first.
    """

    def _expanded_customer(self, customer: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            subs = [
                copy.deepcopy(sub)
                for sub in reversed(self._objects["subscription"].values())
                if sub.get("customer") == customer["id"] and sub.get("status") not in _ENDED
            ]
        url = f"/v1/customers/{customer['id']}/subscriptions"
        return {**customer, "subscriptions": {"object": "list", "data": subs, "has_more": False, "url": url}}


def stripe_env(stub: StripeStub) -> dict[str, str]:
    """The settings of every process of the run: the stub as Stripe, the budget of 20 calls a second."""
    return {"STRIPE_API_BASE": stub.base_url, "STRIPE_API_RATE_LIMIT_PER_SECOND": str(BUDGET_PER_SECOND)}
