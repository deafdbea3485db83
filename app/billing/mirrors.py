"""Disputes, refunds and early fraud warnings, mirrored as Stripe has them now (a sync's rules for them).

The object is read first (with its charge, which says which customer, so
which workspace, it concerns), then written in billing's lock order: the
customer's lock, then the mirror rows by ascending ``stripe_id``. A read is
written only if no later read was (``synced_at`` is when the read began), so
of two syncs of one object the later read wins, whatever order they commit in.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from app.billing.budget import Reservation
from app.billing.repository import BillingRepository
from app.billing.stripe_gateway import StripeGateway
from app.billing.stripe_objects import MirroredObject, MirrorKind
from app.identity import billing_state

logger = logging.getLogger(__name__)


class MirrorService:
    def __init__(self, session: AsyncSession, gateway: StripeGateway, reservation: Reservation | None = None) -> None:
        self.session = session
        self.gateway = gateway
        self.reservation = reservation

    async def sync_object(self, kind: MirrorKind, stripe_id: str, read_began: datetime) -> None:
        """Mirror a dispute, refund or fraud warning as Stripe has it now (two calls: it, then its charge)."""
        obj = await self.gateway.mirrored(kind, stripe_id, self.reservation)
        await self._write(kind, [obj], obj.customer_id, read_began)

    async def sync_refunds_of_charge(self, charge_id: str, read_began: datetime) -> None:
        """Mirror every refund the charge has now: one call lists them with the charge's customer."""
        refunded = await self.gateway.refunded_charge(charge_id, self.reservation)
        await self._write("refund", refunded.refunds, refunded.charge.customer_id, read_began)

    async def _write(
        self, kind: MirrorKind, objects: Sequence[MirroredObject], customer_id: str | None, read_began: datetime
    ) -> None:
        workspace_id = None
        if customer_id is not None:  # a checkout linking the customer commits first
            await BillingRepository.lock_customer(self.session, customer_id)
            workspace_id = await billing_state.workspace_of_customer(self.session, customer_id)
        read = {obj.stripe_id: obj for obj in objects}
        new = []
        for row, created in await BillingRepository.lock_mirror_rows(self.session, kind, list(read)):
            obj = read[row.stripe_id]
            if BillingRepository.write_mirror(row, created, obj, workspace_id, read_began) and created:
                new.append(obj)
        await self.session.flush()
        for obj in new:
            if kind != "refund":
                _warn_operator(obj, workspace_id)


def _warn_operator(obj: MirroredObject, workspace_id: int | None) -> None:
    """A new dispute or fraud warning costs money unless someone acts: say what, where and what to do."""
    amount = f"{obj.amount} {obj.currency}" if obj.amount is not None else "unknown amount"
    where = f"workspace {workspace_id}" if workspace_id is not None else "no workspace"
    if obj.kind == "dispute":
        action = "submit evidence in the Stripe dashboard before the deadline, or accept it"
    else:
        action = "review the charge in the Stripe dashboard; refunding it now avoids a dispute and its fee"
    logger.warning(
        "New Stripe %s %s for %s (%s, customer %s): status %s, reason %s. Action: %s.",
        obj.kind.replace("_", " "),
        obj.stripe_id,
        amount,
        where,
        obj.customer_id or "unknown",
        obj.status,
        obj.reason,
        action,
    )
