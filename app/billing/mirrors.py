"""Disputes, refunds and early fraud warnings, mirrored as Stripe has them now.

In billing's lock order (see ``services``): the object's customer first, then
the mirror rows by ascending ``stripe_id``; each object is read from Stripe
under those locks, so of two syncs of one object the later writes the later
state.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import cast

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.billing.models import BillingDispute, BillingFraudWarning, BillingRefund, StripeMirrorColumns
from app.billing.services import lock_customer
from app.billing.stripe_gateway import StripeGateway
from app.billing.stripe_objects import Charge, MirroredObject, MirrorKind
from app.identity.models import Workspace

logger = logging.getLogger(__name__)

_MirrorModel = type[BillingDispute] | type[BillingRefund] | type[BillingFraudWarning]
_MIRRORS: dict[MirrorKind, _MirrorModel] = {
    "dispute": BillingDispute,
    "refund": BillingRefund,
    "early_fraud_warning": BillingFraudWarning,
}


async def sync_mirror(session: AsyncSession, gateway: StripeGateway, kind: MirrorKind, stripe_id: str) -> None:
    """Mirror a dispute, refund or fraud warning as Stripe has it now.

    Its customer, which is locked first, is known only from Stripe (object,
    then charge, then customer), so the object is read twice: once before the
    locks for that link (it never changes, see ``Charge``), and once under them
    for the state written. The extra read of the object keeps both rules: one
    lock order in every transaction, and the later of two syncs writes the later
    state.
    """
    link = await gateway.mirrored(kind, stripe_id)
    await _sync_mirrors(session, gateway, kind, (stripe_id,), link.customer_id, link.charge)


async def sync_refunds_of_charge(session: AsyncSession, gateway: StripeGateway, charge_id: str) -> None:
    """Mirror every refund the charge has now: one read lists them and names the customer to lock first."""
    refunded = await gateway.refunded_charge(charge_id)
    charge = refunded.charge
    await _sync_mirrors(session, gateway, "refund", refunded.refund_ids, charge.customer_id, charge)


async def _sync_mirrors(
    session: AsyncSession,
    gateway: StripeGateway,
    kind: MirrorKind,
    stripe_ids: Sequence[str],
    customer_id: str | None,
    charge: Charge | None,
) -> None:
    """Lock in the billing order (the customer, then the rows by ``stripe_id``), then read and write each object.

    Every object is read after its row's lock (and its customer's) was taken,
    so of two syncs of one object the later one writes the later state.
    """
    workspace_id = await _lock_customer_workspace(session, customer_id)
    new: list[MirroredObject] = []
    for row, created in await _lock_mirror_rows(session, _MIRRORS[kind], stripe_ids):
        obj = await gateway.mirrored(kind, row.stripe_id, charge)
        if obj.customer_id != customer_id:  # pragma: no cover - a charge's customer does not change
            raise RuntimeError(
                f"Stripe {kind} {obj.stripe_id} belongs to customer {obj.customer_id}, not {customer_id} as read "
                "before locking; retried, to lock the customer it belongs to."
            )
        _write_mirror(row, obj, workspace_id)
        if created and kind != "refund":
            new.append(obj)
    await session.flush()
    for obj in new:
        _warn_operator(obj, workspace_id)


async def _lock_customer_workspace(session: AsyncSession, customer_id: str | None) -> int | None:
    """Lock the customer (a checkout linking it commits first) and return its workspace's id; None: no customer."""
    if customer_id is None:
        return None
    await lock_customer(session, customer_id)
    return await session.scalar(select(Workspace.id).where(Workspace.stripe_customer_id == customer_id))


async def _lock_mirror_rows(
    session: AsyncSession, model: _MirrorModel, stripe_ids: Sequence[str]
) -> list[tuple[StripeMirrorColumns, bool]]:
    """Each object's row, inserted empty if new, locked one by one in ascending ``stripe_id``; and whether it is new.

    ``ON CONFLICT DO NOTHING`` makes a concurrent first sighting wait for the
    inserting transaction, then find the row and lock it.
    """
    locked = []
    for stripe_id in sorted(set(stripe_ids)):
        created = await session.scalar(
            insert(model)
            .values(stripe_id=stripe_id)
            .on_conflict_do_nothing(index_elements=["stripe_id"])
            .returning(model.id)
        )
        row = (await session.scalars(select(model).where(model.stripe_id == stripe_id).with_for_update())).one()
        locked.append((cast(StripeMirrorColumns, row), created is not None))
    return locked


def _write_mirror(row: StripeMirrorColumns, obj: MirroredObject, workspace_id: int | None) -> None:
    row.workspace_id = workspace_id
    row.status, row.amount, row.currency, row.reason = obj.status, obj.amount, obj.currency, obj.reason
    row.stripe_created_at, row.synced_at = obj.created_at, datetime.now(UTC)


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
