"""Billing state copied from Stripe: lock the row, read Stripe now, write what was read.

The lock is taken before the read, so two syncs of one workspace (two workers,
two events) run one after the other and the later one reads, and writes, the
later state: the order events arrive in does not matter. The caller's
transaction (the webhook pipeline's) commits the write and releases the lock.

Every sync of a customer first takes a lock on the customer itself (see
``lock_customer``): the row lock cannot cover a workspace that a checkout is
linking to the customer at that moment.

Every billing transaction takes its locks in one order: the customer's lock
first, then the rows it writes (the workspace's, or mirror rows by ascending
``stripe_id``; a dispute, refund or fraud warning whose charge has no customer
takes only its row's). Two events of one customer then wait for each other
instead of deadlocking: e.g. ``charge.refunded`` (all of a charge's refunds)
and ``refund.updated`` (one of them).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.billing.models import BillingDispute, BillingFraudWarning, BillingRefund, StripeMirrorColumns
from app.billing.stripe_gateway import StripeGateway
from app.billing.stripe_objects import Charge, CustomerBilling, MirroredObject, MirrorKind
from app.identity.models import Workspace
from app.queue.errors import PermanentError

logger = logging.getLogger(__name__)

# SPEC: the member limit follows the seats of a subscription in one of these states.
CURRENT_STATUSES = frozenset({"active", "trialing", "past_due"})
_MirrorModel = type[BillingDispute] | type[BillingRefund] | type[BillingFraudWarning]
_MIRRORS: dict[MirrorKind, _MirrorModel] = {
    "dispute": BillingDispute,
    "refund": BillingRefund,
    "early_fraud_warning": BillingFraudWarning,
}
_MAX_BIGINT_DIGITS = 18
# Advisory-lock class of Stripe customers (two-key locks: apart from every one-key lock, e.g. the inbox's).
_CUSTOMER_LOCK_CLASS = 0x5354


@dataclass(frozen=True)
class BillingSync:
    """A workspace synced, and the seats its billing pays for (identity applies them: ``set_member_limit``)."""

    workspace_id: int
    paid_seats: int


def paid_seats(billing: CustomerBilling, free_plan_member_limit: int) -> int:
    """The seat quantity of the newest current subscription, else the free plan's limit."""
    current = next((s for s in billing.subscriptions if s.status in CURRENT_STATUSES), None)
    seats = current.quantity if current is not None else None
    return seats if seats is not None else free_plan_member_limit


def billing_columns(billing: CustomerBilling) -> dict[str, Any]:
    """The workspace's billing columns (billing's own) for what Stripe says now.

    The subscription shown is the newest current one, else the newest of any
    state (so a cancellation stays visible).
    """
    current = next((s for s in billing.subscriptions if s.status in CURRENT_STATUSES), None)
    shown = current or next(iter(billing.subscriptions), None)
    return {
        "subscription_id": shown.id if shown else None,
        "subscription_status": shown.status if shown else None,
        "price_id": shown.price_id if shown else None,
        "seat_quantity": shown.quantity if shown else None,
        "current_period_end": shown.current_period_end if shown else None,
        "cancel_at_period_end": shown.cancel_at_period_end if shown else False,
    }


async def _sync_locked(
    session: AsyncSession, workspace: Workspace, gateway: StripeGateway, free_plan_member_limit: int
) -> BillingSync:
    """Read Stripe and write what it says; ``billing_synced_at`` is when the read began, by the database's clock.

    The database's clock, the one ``received_at`` is stamped with: a worker's
    own clock running ahead would let an event skip a read it needed.
    """
    assert workspace.stripe_customer_id is not None
    read_from = await session.scalar(select(func.clock_timestamp()))
    billing = await gateway.customer_billing(workspace.stripe_customer_id)
    for name, value in billing_columns(billing).items():
        setattr(workspace, name, value)
    workspace.billing_synced_at = read_from
    await session.flush()
    return BillingSync(workspace.id, paid_seats(billing, free_plan_member_limit))


def read_since(workspace: Workspace, received_at: datetime | None) -> bool:
    """Whether a read of the workspace's customer began after an event arrived: then it already holds its change.

    Stripe sends an event after the change it reports, so a read that began
    later saw the change. Syncs of a workspace run one after the other under its
    lock, so a burst of events about one customer costs one read, not one each.
    """
    synced = workspace.billing_synced_at
    return received_at is not None and synced is not None and synced >= received_at


async def lock_customer(session: AsyncSession, customer_id: str) -> None:
    """Serialise every sync of one Stripe customer, linked or not, until the transaction ends.

    A sync finds its workspace by ``stripe_customer_id``; while a checkout is
    linking that customer (uncommitted), the lookup sees no workspace, and the
    event would be processed as "nothing to sync": if Stripe changed after the
    checkout's read, that change was lost. Both take this lock first, so the
    event waits for the checkout to commit, then sees the link and reads Stripe.
    A mirrored dispute, refund or fraud warning takes it before looking up its
    workspace, for the same reason.
    """
    await session.execute(select(func.pg_advisory_xact_lock(_CUSTOMER_LOCK_CLASS, func.hashtext(customer_id))))


async def sync_customer(
    session: AsyncSession,
    gateway: StripeGateway,
    customer_id: str,
    free_plan_member_limit: int,
    *,
    received_at: datetime | None = None,
) -> BillingSync | None:
    """Copy the customer's current billing state onto its workspace, under the workspace's row lock.

    ``received_at``: when the event asking for it arrived; if a read began
    since, nothing is read (``read_since``) and None is returned, as when the
    customer is linked to no workspace.
    """
    await lock_customer(session, customer_id)
    workspace = await session.scalar(
        select(Workspace)
        .where(Workspace.stripe_customer_id == customer_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    if workspace is None:
        logger.info("Stripe customer %s is linked to no workspace: nothing to sync.", customer_id)
        return None
    if read_since(workspace, received_at):
        logger.info("Stripe customer %s was read after this event arrived: no new read.", customer_id)
        return None
    return await _sync_locked(session, workspace, gateway, free_plan_member_limit)


async def _lock_referenced_workspace(session: AsyncSession, session_id: str, reference: str) -> Workspace:
    """``client_reference_id`` is the workspace's primary key or its Clerk organization id."""
    by_id = reference.isdigit() and len(reference) <= _MAX_BIGINT_DIGITS
    condition = Workspace.id == int(reference) if by_id else Workspace.clerk_org_id == reference
    workspace = await session.scalar(select(Workspace).where(condition).with_for_update())
    if workspace is not None:
        return workspace
    if by_id:
        raise PermanentError(
            f"Checkout session {session_id} names workspace {reference} (client_reference_id), which does not exist: "
            "start checkouts with a workspace id or a Clerk organization id."
        )
    # Retried: the organization's own Clerk event may not have been processed yet.
    raise LookupError(
        f"Checkout session {session_id} names Clerk organization {reference!r}, which has no workspace yet; "
        "retried until its organization event is processed."
    )


async def _link_customer(session: AsyncSession, workspace: Workspace, customer_id: str, session_id: str) -> None:
    if workspace.stripe_customer_id == customer_id:
        return
    holder = await session.scalar(select(Workspace.id).where(Workspace.stripe_customer_id == customer_id))
    if holder is not None:
        raise PermanentError(
            f"Checkout session {session_id} links Stripe customer {customer_id} to workspace {workspace.id}, but the "
            f"customer already belongs to workspace {holder}: unlink one of them by hand, then replay the event."
        )
    if workspace.stripe_customer_id is not None:
        logger.warning(
            "Workspace %s moves from Stripe customer %s to %s (checkout session %s).",
            workspace.id,
            workspace.stripe_customer_id,
            customer_id,
            session_id,
        )
    workspace.stripe_customer_id = customer_id


async def link_checkout(
    session: AsyncSession, gateway: StripeGateway, session_id: str, free_plan_member_limit: int
) -> BillingSync | None:
    """Link the session's customer to the workspace it names (read from Stripe), then sync that workspace."""
    checkout = await gateway.checkout_session(session_id)
    if checkout.customer_id is None:
        logger.info("Checkout session %s has no customer: nothing to link or sync.", session_id)
        return None
    if checkout.client_reference_id is None:
        return await sync_customer(session, gateway, checkout.customer_id, free_plan_member_limit)
    await lock_customer(session, checkout.customer_id)
    workspace = await _lock_referenced_workspace(session, session_id, checkout.client_reference_id)
    await _link_customer(session, workspace, checkout.customer_id, session_id)
    return await _sync_locked(session, workspace, gateway, free_plan_member_limit)


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
