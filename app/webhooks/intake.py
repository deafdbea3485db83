"""The intake service: what happens to a verified delivery, in the order docs/behaviour.md gives (steps 4 to 8).

Rate limit (429), unhandled type (200, dropped), store once, then queue; never
inside an uncommitted transaction, and a failed queueing still answers 200
(the row is stored; the recovery cron queues it). The route handler only turns
the :class:`IntakeDecision` into an answer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from functools import partial

from app.core.metrics import DELIVERIES, child
from app.core.rate_limit import SlidingWindowRateLimiter
from app.core.request_context import current_request_id
from app.core.resources import Resources
from app.webhooks.client_ip import rate_limit_key
from app.webhooks.guards import VerifiedDelivery
from app.webhooks.handlers import StoredKeys
from app.webhooks.inbox import Inbox, StoredEvent
from app.webhooks.jobs import queue_processing
from app.webhooks.payload import encode_for_inbox, normalized_for_inbox
from app.webhooks.providers.base import WebhookProvider
from app.webhooks.refusals import Refusal, RefusalLog

logger = logging.getLogger(__name__)


class IntakeOutcome(StrEnum):
    """What became of a delivery; the values are the ``outcome`` label of the delivery metrics."""

    STORED = "stored"
    DUPLICATE = "duplicate"
    IGNORED = "ignored"
    RATE_LIMITED = "rate_limited"
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True, slots=True)
class IntakeDecision:
    outcome: IntakeOutcome
    retry_after: int = 0


@dataclass
class WebhookIntake:
    """One provider's intake, built once at start-up."""

    provider: WebhookProvider
    handles: Callable[[str], bool]
    """Whether a loaded module handles an event type (``handled_types``); others are acknowledged and dropped."""
    keys: StoredKeys
    """The event's tenant and sync subject, as the module that handles it decides them (``stored_keys``)."""
    limiter: SlidingWindowRateLimiter
    refusals: RefusalLog
    resources: Resources

    def __post_init__(self) -> None:
        # Every outcome's series exists from the start at 0, so a rate over it (an alert rule) sees its first rise.
        for outcome in (*IntakeOutcome, *Refusal):
            child(DELIVERIES, self.provider.name, outcome.value)

    async def receive(self, delivery: VerifiedDelivery) -> IntakeDecision:
        decision = await self._decide(delivery)
        if decision.outcome is not IntakeOutcome.RATE_LIMITED:  # a refusal: counted with the others
            child(DELIVERIES, self.provider.name, decision.outcome.value).inc()
        return decision

    async def _decide(self, delivery: VerifiedDelivery) -> IntakeDecision:
        name, event = self.provider.name, delivery.event
        limit = await self.limiter.hit(name, rate_limit_key(delivery.client))
        if not limit.allowed:
            detail = f"over {self.limiter.limit} requests per minute."
            self.refusals.record(name, Refusal.RATE_LIMITED, delivery.client, detail)
            return IntakeDecision(IntakeOutcome.RATE_LIMITED, limit.retry_after)
        if not self.handles(event.event_type):
            return IntakeDecision(IntakeOutcome.IGNORED)
        # The payload as stored, NULs replaced (VerifiedEvent): the keys below are read from it, so they hold none.
        text = encode_for_inbox(event.payload, delivery.body, nul_replaced=event.nul_replaced)
        if event.nul_replaced:
            logger.warning(
                "%s event %s carries NUL characters, which Postgres cannot store; stored with U+FFFD in their place.",
                name,
                event.event_id,
            )
        keys = await self.keys(self.resources, event.event_type, event.payload)
        try:
            stored = await Inbox(self.resources.db).store(
                name,
                event.event_id,
                event.event_type,
                text,
                request_id=current_request_id(),
                tenant_key=keys.tenant,
                sync_subject=keys.subject,
                normalized=partial(normalized_for_inbox, event.payload),
            )
        except Exception as exc:
            logger.error("Could not store %s event %s: %s", name, event.event_id, exc, exc_info=exc)
            return IntakeDecision(IntakeOutcome.UNAVAILABLE)
        if stored.outcome == "reopened":
            logger.info("Set-aside %s event %s reopened by a redelivery.", name, event.event_id)
        if not stored.processed:
            await self._queue(stored, event.event_id)
        return IntakeDecision(IntakeOutcome.STORED if stored.outcome == "inserted" else IntakeOutcome.DUPLICATE)

    async def _queue(self, stored: StoredEvent, event_id: str) -> None:
        try:  # a redelivery's job carries the stored event's request id and tenant, as every other run of it does
            await queue_processing(
                self.resources.queue,
                self.provider.name,
                stored.row_id,
                tenant_key=stored.tenant_key,
                request_id=stored.request_id,
            )
        except Exception as exc:  # the row is stored: the recovery cron queues it later
            logger.warning(
                "Stored %s event %s (row %s) but could not queue it (%s); the recovery cron will retry.",
                self.provider.name,
                event_id,
                stored.row_id,
                exc,
            )
