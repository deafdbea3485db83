"""Billing reconciliation: linked workspaces read from Stripe again, and corrected where they differ.

The events keep a workspace's billing state current; this repairs what they
could not: an event Stripe stopped redelivering, a member-limit job that was
lost, a row edited by hand, a handler bug since fixed. Each workspace is one
transaction under the same locks as an event's sync (its customer, then its
row), read through the same budget; the differences are reported column by
column, and the members are re-seated for the limit Stripe says. A workspace
that cannot be read (a customer Stripe no longer has, a timeout) is logged and
counted, and the run goes on with the next one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from app.billing.budget import stripe_gateway
from app.billing.repository import BillingRepository
from app.billing.services import billing_columns, paid_seats
from app.billing.stripe_gateway import StripeGateway
from app.core.redaction import SecretScrubber
from app.core.resources import Resources
from app.identity import billing_state
from app.identity.seats import reseat

logger = logging.getLogger(__name__)


def shown(value: Any) -> str:
    """A column's value as an operator reads it: ISO times (UTC), plain numbers and words, empty for None."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return (value.astimezone(UTC) if value.tzinfo else value).isoformat()
    return str(value)


def _logged(value: Any) -> str:
    return shown(value) if value is not None else "none"


@dataclass(frozen=True)
class Difference:
    workspace_id: int
    column: str
    stored: Any
    stripe: Any


@dataclass(frozen=True)
class Failure:
    """A workspace this run could not reconcile, and why (secrets scrubbed)."""

    workspace_id: int
    customer_id: str
    error: str

    def line(self) -> str:
        return f"Workspace {self.workspace_id} (customer {self.customer_id}) could not be reconciled: {self.error}"


@dataclass
class ReconcileReport:
    dry_run: bool
    reconciled: int = 0
    differences: list[Difference] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)

    @property
    def differed(self) -> int:
        return len({difference.workspace_id for difference in self.differences})

    def summary(self) -> str:
        """The command's last line (docs/operations.md): ``Reconciled N workspaces; M differed.``"""
        return f"Reconciled {self.reconciled} workspaces; {self.differed} differed."


async def due_workspaces(resources: Resources, *, every: bool) -> list[tuple[int, str]]:
    """Linked workspaces (id, customer) not synced for ``BILLING_RECONCILE_AFTER_HOURS`` (or all of them)."""
    hours = resources.settings.billing_reconcile_after_hours
    async with resources.db.session() as session:
        return list(await billing_state.linked_workspaces(session, every=every, stale_hours=hours))


async def reconcile_billing(resources: Resources, *, every: bool = False, dry_run: bool = False) -> ReconcileReport:
    """Every due workspace, each on its own: one that fails is logged and counted in ``failures``, not fatal."""
    report, gateway = ReconcileReport(dry_run), stripe_gateway(resources)
    scrubber = SecretScrubber(resources.settings.secret_values())
    for workspace_id, customer_id in await due_workspaces(resources, every=every):
        try:
            differences = await _reconcile_one(resources, gateway, workspace_id, customer_id, dry_run=dry_run)
        except Exception as exc:
            failure = Failure(workspace_id, customer_id, scrubber.text(f"{type(exc).__name__}: {exc}"))
            report.failures.append(failure)
            logger.warning("Billing reconciliation: %s; the others go on.", failure.line())
            continue
        report.reconciled += 1
        report.differences += differences
        if differences:
            logger.warning(
                "Billing reconciliation: workspace %s (customer %s) differed from Stripe in %s%s.",
                workspace_id,
                customer_id,
                ", ".join(f"{d.column} ({_logged(d.stored)} -> {_logged(d.stripe)})" for d in differences),
                " (dry run: not corrected)" if dry_run else "; corrected",
            )
    logger.info("%s", report.summary())
    if report.failures:
        logger.warning(
            "Billing reconciliation: %d workspaces could not be reconciled (each named above); the next run tries "
            "them again.",
            len(report.failures),
        )
    return report


async def _reconcile_one(
    resources: Resources, gateway: StripeGateway, workspace_id: int, customer_id: str, *, dry_run: bool
) -> list[Difference]:
    async with resources.db.session() as session:
        await BillingRepository.lock_customer(session, customer_id)
        stored = await billing_state.locked_billing(session, workspace_id, customer_id)
        if stored is None:  # unlinked meanwhile
            return []
        read_began = await BillingRepository.clock(session)
        billing = await gateway.customer_billing(customer_id)
        columns = billing_columns(billing)
        wanted = {**columns, "member_limit": paid_seats(billing, resources.settings.free_plan_member_limit)}
        differences = [
            Difference(workspace_id, column, stored[column], value)
            for column, value in wanted.items()
            if stored[column] != value
        ]
        if dry_run:
            return differences
        await billing_state.write_billing(session, workspace_id, columns, read_began)
        _, seats = await reseat(session, workspace_id, wanted["member_limit"])
        await session.commit()
    if seats.changed:
        logger.info("Workspace %s re-seated: suspended %s, restored %s.", workspace_id, seats.suspended, seats.restored)
    return differences
