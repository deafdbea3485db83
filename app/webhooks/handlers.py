"""What a provider's event handler receives, and how the worker finds the handler.

Handlers belong to the feature module that owns the data (billing for Stripe,
identity for Clerk) and are declared in that module's ``MODULE.webhook_handlers``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.module import FeatureModule
from app.core.resources import Resources
from app.queue.job import Job
from app.webhooks.models import WebhookEvent

logger = logging.getLogger(__name__)


@dataclass
class WebhookContext:
    """One processing attempt of one inbox event.

    ``session`` is the handler's transaction: the handler's writes and the
    event's ``processed_at`` commit together, so an effect on our own tables
    happens exactly once. Jobs to queue as a consequence go through
    :meth:`queue_after_commit`, so no worker looks before the data exists.
    """

    resources: Resources
    session: AsyncSession
    event: WebhookEvent
    _after_commit: list[tuple[type[Job[Any]], Any, str | None, timedelta | None]] = field(default_factory=list)

    @property
    def payload(self) -> dict[str, Any]:
        return self.event.payload

    def queue_after_commit(
        self,
        job_cls: type[Job[Any]],
        data: Any,
        *,
        deduplication_id: str | None = None,
        delay: timedelta | None = None,
    ) -> None:
        self._after_commit.append((job_cls, data, deduplication_id, delay))

    async def flush_after_commit(self) -> None:
        for job_cls, data, deduplication_id, delay in self._after_commit:
            try:
                await self.resources.queue.add(job_cls, data, deduplication_id=deduplication_id, delay=delay)
            except Exception:
                logger.exception(
                    "Could not queue %s after processing %s event %s; it runs with the next event or a retry.",
                    job_cls.__name__,
                    self.event.provider,
                    self.event.event_id,
                )
        self._after_commit.clear()


WebhookHandler = Callable[[WebhookContext], Awaitable[None]]


def find_handler(modules: Sequence[FeatureModule], provider: str) -> WebhookHandler | None:
    for module in modules:
        handler = module.webhook_handlers.get(provider)
        if handler is not None:
            return handler
    return None
