"""What a provider's event handler receives, and how the worker finds the handler.

Handlers belong to the feature module that owns the data (billing for Stripe,
identity for Clerk) and are declared in that module's ``MODULE.webhook_handlers``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.module import FeatureModule
from app.core.resources import Resources
from app.queue.job import Job
from app.webhooks.models import WebhookEvent


@dataclass
class WebhookContext:
    """One processing attempt of one inbox event.

    ``session`` is the handler's transaction: the handler's writes and the
    event's ``processed_at`` commit together, so an effect on our own tables
    happens exactly once. Jobs to queue as a consequence go through
    :meth:`queue`, which stages them in that same transaction: none is queued
    if it rolls back, none is lost if it commits.
    """

    resources: Resources
    session: AsyncSession
    event: WebhookEvent

    @property
    def payload(self) -> dict[str, Any]:
        return self.event.payload

    async def queue(
        self,
        job_cls: type[Job[Any]],
        data: Any,
        *,
        deduplication_id: str | None = None,
        delay: timedelta | None = None,
        retry_limit: int | None = None,
    ) -> str | None:
        """Stage a follow-up job in the handler's transaction; the pipeline queues it right after its commit.

        If this process dies or Redis is away at that moment, a worker queues
        it within seconds (``queue.add(..., session=...)``, SPEC 7).
        """
        return await self.resources.queue.add(
            job_cls,
            data,
            deduplication_id=deduplication_id,
            delay=delay,
            retry_limit=retry_limit,
            session=self.session,
        )


WebhookHandler = Callable[[WebhookContext], Awaitable[None]]


def find_handler(modules: Sequence[FeatureModule], provider: str) -> WebhookHandler | None:
    for module in modules:
        handler = module.webhook_handlers.get(provider)
        if handler is not None:
            return handler
    return None
