"""A customer's story, told through the real handlers: the workspace whose timeline the tests read.

Acme signs up (Clerk), four members join its free plan of 3 seats (the fourth
is suspended at once), it buys 5 seats (Stripe checkout: the fourth gets its
seat back), renames itself, then goes down to 2 seats (two members lose
theirs). "Why was I removed from my team?" is answered by its timeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from app.core.resources import Resources
from app.identity.models import Workspace
from app.testing import (
    clerk_event,
    process_delivery,
    signed_clerk_delivery,
    signed_stripe_delivery,
    stripe_event,
    stripe_object,
    stripe_subscription,
)
from app.testing.stripe_stub import StripeStub

T0 = 1_750_000_000_000
ORG, CUSTOMER, PERIOD_END = "org_acme", "cus_acme", 1_900_000_000


@dataclass(frozen=True)
class Story:
    workspace_id: int
    rename_row: int
    seats_row: int
    """The inbox row of the subscription event that took the workspace down to 2 seats."""


async def _clerk(resources: Resources, secret: str, event_type: str, timestamp: int, **data: Any) -> int:
    row = await process_delivery(
        resources, signed_clerk_delivery(clerk_event(event_type, timestamp=timestamp, **data), secret)
    )
    assert row.processed, row.last_error
    return row.row_id


async def _stripe(resources: Resources, secret: str, event_type: str, obj: dict[str, Any]) -> int:
    row = await process_delivery(resources, signed_stripe_delivery(stripe_event(event_type, obj), secret))
    assert row.processed, row.last_error
    return row.row_id


def subscription(stub: StripeStub, quantity: int) -> dict[str, Any]:
    stub.put_subscription(
        CUSTOMER, id="sub_acme", quantity=quantity, price_id="price_team", current_period_end=PERIOD_END
    )
    return stripe_subscription(CUSTOMER, id="sub_acme", quantity=quantity)


async def tell(worker: Resources, stub: StripeStub, secrets: dict[str, str]) -> Story:
    """The story, processed as a worker would (``worker``: billing and identity, jobs run inline)."""
    clerk, stripe = secrets["clerk"], secrets["stripe"]
    await _clerk(worker, clerk, "organization.created", T0, id=ORG, name="Acme", slug="acme")
    base = clerk_event("organizationMembership.created")["data"]
    for n in range(4):
        await _clerk(
            worker,
            clerk,
            "organizationMembership.created",
            T0 + 1 + n,
            id=f"orgmem_acme_{n}",
            created_at=T0 + 1 + n,
            organization={**base["organization"], "id": ORG, "name": "Acme"},
            public_user_data={**base["public_user_data"], "user_id": f"user_acme_{n}", "first_name": f"Member {n}"},
        )
    stub.put_customer(CUSTOMER)
    subscription(stub, 5)
    stub.put_checkout_session("cs_acme", customer=CUSTOMER, client_reference_id=ORG)
    await _stripe(worker, stripe, "checkout.session.completed", stripe_object("checkout.session", id="cs_acme"))
    rename = await _clerk(worker, clerk, "organization.updated", T0 + 100, id=ORG, name="Acme Corp", slug="acme")
    seats = await _stripe(worker, stripe, "customer.subscription.updated", subscription(stub, 2))
    async with worker.db.session() as session:
        workspace = (await session.scalars(select(Workspace.id))).one()
    return Story(workspace, rename, seats)
