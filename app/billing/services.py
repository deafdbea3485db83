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
``stripe_id``, in ``mirrors``; a dispute, refund or fraud warning whose
charge has no customer takes only its row's). Two events of one customer then
wait for each other instead of deadlocking: e.g. ``charge.refunded`` (all of
a charge's refunds) and ``refund.updated`` (one of them).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession

from app.billing.stripe_gateway import StripeGateway
from app.billing.stripe_objects import CustomerBilling
from app.identity.models import Workspace
from app.queue.errors import PermanentError

logger = logging.getLogger(__name__)

# The member limit follows the seats of a subscription in one of these states (docs/architecture.md, billing).
CURRENT_STATUSES = frozenset({"active", "trialing", "past_due"})
_MAX_BIGINT_DIGITS = 18
# Advisory-lock class of Stripe customers (two-key locks: apart from every one-key lock, e.g. the inbox's).
_CUSTOMER_LOCK_CLASS = 0x5354
# Built once: every Stripe event of a linked customer runs these (a burst about one customer mostly these alone).
_LOCK_CUSTOMER = text(f"SELECT pg_advisory_xact_lock({_CUSTOMER_LOCK_CLASS}, hashtext(:customer_id))")
_LOCK_WORKSPACE_OF_CUSTOMER = text(
    "SELECT id, billing_synced_at FROM workspace WHERE stripe_customer_id = :customer_id FOR UPDATE"
)
_READ_BEGINS = text("SELECT clock_timestamp()")


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
    session: AsyncSession,
    workspace: Workspace,
    gateway: StripeGateway,
    free_plan_member_limit: int,
    *,
    may_park: bool = False,
) -> BillingSync:
    """Read Stripe and write what it says; ``billing_synced_at`` is when the read began, by the database's clock.

    The database's clock, the one ``received_at`` is stamped with: a worker's
    own clock running ahead would let an event skip a read it needed.
    """
    assert workspace.stripe_customer_id is not None
    read_from = await session.scalar(_READ_BEGINS)
    billing = await gateway.customer_billing(workspace.stripe_customer_id, may_park=may_park)
    for name, value in billing_columns(billing).items():
        setattr(workspace, name, value)
    workspace.billing_synced_at = read_from
    await session.flush()
    return BillingSync(workspace.id, paid_seats(billing, free_plan_member_limit))


def read_since(synced: datetime | None, received_at: datetime | None) -> bool:
    """Whether a read of the customer began (at ``synced``) after an event arrived: then it holds its change.

    Stripe sends an event after the change it reports, so a read that began
    later saw the change. Syncs of a workspace run one after the other under its
    lock, so a burst of events about one customer costs one read, not one each.
    """
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
    await session.execute(_LOCK_CUSTOMER, {"customer_id": customer_id})


async def sync_customer(
    session: AsyncSession,
    gateway: StripeGateway,
    customer_id: str,
    free_plan_member_limit: int,
    *,
    received_at: datetime | None = None,
    may_park: bool = False,
) -> BillingSync | None:
    """Copy the customer's current billing state onto its workspace, under the workspace's row lock.

    ``received_at``: when the event asking for it arrived; if a read began
    since, nothing is read (``read_since``) and None is returned, as when the
    customer is linked to no workspace. ``may_park``: a webhook's job, which
    may come back for its turn of the Stripe budget (its transaction then
    rolls back and its locks go; see ``StripeBudget.acquire``).
    """
    await lock_customer(session, customer_id)
    locked = (await session.execute(_LOCK_WORKSPACE_OF_CUSTOMER, {"customer_id": customer_id})).first()
    if locked is None:
        logger.info("Stripe customer %s is linked to no workspace: nothing to sync.", customer_id)
        return None
    if read_since(locked.billing_synced_at, received_at):
        logger.info("Stripe customer %s was read after this event arrived: no new read.", customer_id)
        return None
    # Locked above; loaded whole only when it is read (the row as committed before the lock was granted).
    workspace = await session.get(Workspace, locked.id, populate_existing=True)
    assert workspace is not None
    return await _sync_locked(session, workspace, gateway, free_plan_member_limit, may_park=may_park)


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
