"""Billing's rules: what a sync of a customer or a checkout reads from Stripe and writes, under which locks.

A sync reads Stripe under the locks of what it writes, so two syncs of one
workspace run one after the other and the later one reads, and writes, the
later state: the order events arrive in does not matter. Every billing
transaction takes its locks in one order: the sync's subject (taken by
``sync``), the customer (``BillingRepository.lock_customer``), then the rows
it writes (the workspace's, or mirror rows by ascending ``stripe_id``, in
``mirrors``). Two syncs of one customer then wait for each other instead of
deadlocking.

The customer's lock also covers a workspace that a checkout is linking to the
customer at that moment: while the link is uncommitted, a lookup by customer
sees no workspace, and an event would be processed as "nothing to sync"
although Stripe changed after the checkout's read. Both take the lock first,
so the event's sync waits for the checkout to commit, then sees the link and
reads Stripe.

The caller (``app/billing/sync.py``) owns the transaction: it commits the
writes with the events they cover.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.billing.budget import Reservation
from app.billing.repository import BillingRepository
from app.billing.stripe_gateway import StripeGateway
from app.billing.stripe_objects import CustomerBilling, CustomerOfKind
from app.identity import billing_state
from app.queue.errors import PermanentError

logger = logging.getLogger(__name__)

# The member limit follows the seats of a subscription in one of these states (docs/architecture.md, billing).
CURRENT_STATUSES = frozenset({"active", "trialing", "past_due"})
_MAX_BIGINT_DIGITS = 18


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


NewestEvent = Callable[[], Awaitable[datetime | None]]
"""When the latest event the sync covers arrived (asked under the customer's lock, so nothing newer is missed)."""


class BillingService:
    """One sync's work in ``session``'s transaction; ``reservation``: its slots of the Stripe budget (None: commands').

    ``newest_event``: the sync's (None: a command's, which always reads). A customer whose workspace was written
    from a read that began after the latest of the sync's events arrived is not read again: that read covers them.
    """

    def __init__(
        self,
        session: AsyncSession,
        gateway: StripeGateway,
        free_plan_member_limit: int,
        reservation: Reservation | None = None,
        newest_event: NewestEvent | None = None,
    ) -> None:
        self.session = session
        self.gateway = gateway
        self.free_plan_member_limit = free_plan_member_limit
        self.reservation = reservation
        self.newest_event = newest_event

    async def sync_customer(self, customer_id: str, read_began: datetime) -> BillingSync | None:
        """Copy the customer's current billing state onto its workspace; None when it is linked to no workspace, or
        when it was read after the sync's events arrived (no read then).

        ``read_began``: when the sync began (the database's clock, the one
        ``received_at`` is stamped with): ``billing_synced_at``, and what the
        events it covers are measured against.
        """
        await BillingRepository.lock_customer(self.session, customer_id)
        locked = await billing_state.lock_billing_of_customer(self.session, customer_id)
        if locked is None:
            logger.info("Stripe customer %s is linked to no workspace: nothing to sync.", customer_id)
            return None
        workspace_id, synced_at = locked
        if synced_at is not None and self.newest_event is not None:
            newest = await self.newest_event()
            if newest is not None and synced_at >= newest:
                logger.info("Stripe customer %s was read after the events of this sync arrived: no read.", customer_id)
                return None
        return await self._read_and_write(workspace_id, customer_id, read_began)

    async def sync_customer_of(self, kind: CustomerOfKind, object_id: str, read_began: datetime) -> BillingSync | None:
        """Read the subscription or invoice for its customer (what a thin event left unknown), then sync that
        customer as :meth:`sync_customer` does."""
        customer_id = await self.gateway.customer_of(kind, object_id, self.reservation)
        if customer_id is None:
            logger.info("Stripe %s %s has no customer: nothing to sync.", kind, object_id)
            return None
        return await self.sync_customer(customer_id, read_began)

    async def link_checkout(self, session_id: str, read_began: datetime) -> BillingSync | None:
        """Link the session's customer to the workspace it names (read from Stripe), then sync that workspace.

        ``client_reference_id`` is the workspace's primary key or its Clerk organization id.
        """
        checkout = await self.gateway.checkout_session(session_id, self.reservation)
        if checkout.customer_id is None:
            logger.info("Checkout session %s has no customer: nothing to link or sync.", session_id)
            return None
        if checkout.client_reference_id is None:
            return await self.sync_customer(checkout.customer_id, read_began)
        await BillingRepository.lock_customer(self.session, checkout.customer_id)
        workspace_id, linked = await self._lock_referenced_workspace(session_id, checkout.client_reference_id)
        await self._link(workspace_id, linked, checkout.customer_id, session_id)
        return await self._read_and_write(workspace_id, checkout.customer_id, read_began)

    async def _read_and_write(self, workspace_id: int, customer_id: str, read_began: datetime) -> BillingSync:
        billing = await self.gateway.customer_billing(customer_id, self.reservation)
        if not await billing_state.write_billing(self.session, workspace_id, billing_columns(billing), read_began):
            logger.info("Workspace %s was written from a later read of Stripe meanwhile: kept.", workspace_id)
        return BillingSync(workspace_id, paid_seats(billing, self.free_plan_member_limit))

    async def _lock_referenced_workspace(self, session_id: str, reference: str) -> tuple[int, str | None]:
        """The workspace's id and the customer it is linked to now, locked."""
        by_id = reference.isdigit() and len(reference) <= _MAX_BIGINT_DIGITS
        found = await billing_state.lock_workspace(
            self.session, workspace_id=int(reference) if by_id else None, clerk_org_id=None if by_id else reference
        )
        if found is not None:
            return found
        if by_id:
            raise PermanentError(
                f"Checkout session {session_id} names workspace {reference} (client_reference_id), which does not "
                "exist: start checkouts with a workspace id or a Clerk organization id."
            )
        # Retried: the organization's own Clerk event may not have been processed yet.
        raise LookupError(
            f"Checkout session {session_id} names Clerk organization {reference!r}, which has no workspace yet; "
            "retried until its organization event is processed."
        )

    async def _link(self, workspace_id: int, linked: str | None, customer_id: str, session_id: str) -> None:
        if linked == customer_id:
            return
        holder = await billing_state.workspace_of_customer(self.session, customer_id)
        if holder is not None:
            raise PermanentError(
                f"Checkout session {session_id} links Stripe customer {customer_id} to workspace {workspace_id}, "
                f"but the customer already belongs to workspace {holder}: unlink one of them by hand, then replay "
                "the event."
            )
        if linked is not None:
            logger.warning(
                "Workspace %s moves from Stripe customer %s to %s (checkout session %s).",
                workspace_id,
                linked,
                customer_id,
                session_id,
            )
        await billing_state.link_customer(self.session, workspace_id, customer_id)
