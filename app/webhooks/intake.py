"""Intake of one signed delivery, in the order of SPEC section 5."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum
from typing import Any

import msgspec

from app.core.resources import Resources
from app.webhooks.inbox import store_event
from app.webhooks.jobs import ProcessWebhookEventData, ProcessWebhookEventJob, deduplication_id
from app.webhooks.providers.base import VerifiedEvent, Verifier, WebhookProvider, parse_json_object
from app.webhooks.rate_limit import RateDecision, SlidingWindowRateLimiter

logger = logging.getLogger(__name__)


class IntakeResult(Enum):
    QUEUED = "queued"
    STORED_NOT_QUEUED = "stored, queueing failed"
    ALREADY_PROCESSED = "already processed"
    IGNORED = "unhandled type"


class StorageUnavailable(Exception):
    """Postgres could not store the event: answer 503 so the provider delivers it again."""


@dataclass
class ProviderIntake:
    """Everything one provider's route needs, built once at start-up."""

    provider: WebhookProvider
    verify: Verifier
    limiter: SlidingWindowRateLimiter
    resources: Resources

    async def rate_limit(self, client: str) -> RateDecision:
        return await self.limiter.hit(self.provider.name, client)

    async def accept(self, event: VerifiedEvent, body: bytes) -> IntakeResult:
        """Store once, then queue (never inside an uncommitted transaction)."""
        if not self.provider.handles(event.event_type):
            return IntakeResult.IGNORED
        try:
            stored = await store_event(
                self.resources.db, self.provider.name, event.event_id, event.event_type, self._storable(event, body)
            )
        except Exception as exc:
            logger.error("Could not store %s event %s: %s", self.provider.name, event.event_id, exc, exc_info=exc)
            raise StorageUnavailable(str(exc)) from exc
        if stored.processed:
            return IntakeResult.ALREADY_PROCESSED
        if stored.outcome == "reopened":
            logger.info("Set-aside %s event %s reopened by a redelivery.", self.provider.name, event.event_id)
        return await self._enqueue(stored.row_id, event.event_id)

    def _storable(self, event: VerifiedEvent, body: bytes) -> str:
        """The body as the inbox stores it: Postgres' jsonb cannot hold a NUL character (``\\u0000``).

        Such an event would fail to store on every delivery and be lost, so its
        NULs become U+FFFD (the replacement character) instead; nothing else changes.
        """
        text = body.decode()
        if "\\u0000" not in text:  # one scan of the body; the parsed payload is walked only when it may hold one
            return text
        payload = event.payload if event.payload is not None else parse_json_object(body)
        cleaned = without_nul(payload)
        if cleaned == payload:  # an escaped backslash followed by "u0000": no NUL after all
            return text
        logger.warning(
            "%s event %s carries NUL characters, which Postgres cannot store; stored with U+FFFD in their place.",
            self.provider.name,
            event.event_id,
        )
        return msgspec.json.encode(cleaned).decode()

    async def _enqueue(self, row_id: int, event_id: str) -> IntakeResult:
        try:
            await self.resources.queue.add(
                ProcessWebhookEventJob,
                ProcessWebhookEventData(event_row_id=row_id),
                deduplication_id=deduplication_id(row_id),
            )
        except Exception as exc:  # the row is stored: the recovery cron queues it later
            logger.warning(
                "Stored %s event %s (row %s) but could not queue it (%s); the recovery cron will retry.",
                self.provider.name,
                event_id,
                row_id,
                exc,
            )
            return IntakeResult.STORED_NOT_QUEUED
        return IntakeResult.QUEUED


def without_nul(value: Any) -> Any:
    """``value`` (parsed JSON) with every NUL in its strings and keys replaced by U+FFFD."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {without_nul(key): without_nul(item) for key, item in value.items()}
    if isinstance(value, list):
        return [without_nul(item) for item in value]
    return value
