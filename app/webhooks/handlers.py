"""What a provider's event handler receives, and how the intake and the worker find the handler.

Handlers belong to the feature module that owns the data (billing for Stripe,
identity for Clerk) and are declared in that module's ``MODULE.webhook_handlers``,
as :class:`EventRoutes` (types to handlers). Those routes are the one list of
the types handled: the intake stores an event only if a loaded module routes
its type, and the worker runs the handler it routes to.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.module import FeatureModule
from app.core.resources import Resources
from app.queue.job import Job
from app.webhooks.event_source import EventSource
from app.webhooks.models import WebhookEvent

logger = logging.getLogger(__name__)


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
        it within seconds (``queue.add(..., session=...)``, docs/jobs.md).
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


@dataclass(frozen=True)
class EventRoutes:
    """Event types to handlers: exact types (``invoice.paid``) or prefixes written ``customer.subscription.*``.

    An exact type wins over a prefix, and a longer prefix over a shorter one.
    """

    routes: Mapping[str, WebhookHandler]
    backfill: EventSource | None = None
    """The provider's list of recent events, if it has one: the backfill asks it for events never delivered."""

    def handler_for(self, event_type: str) -> WebhookHandler | None:
        if event_type in self.routes:
            return self.routes[event_type]
        prefixes = [p for p in self.routes if p.endswith(".*") and event_type.startswith(p[:-1])]
        return self.routes[max(prefixes, key=len)] if prefixes else None

    def handles(self, event_type: str) -> bool:
        return self.handler_for(event_type) is not None

    async def __call__(self, context: WebhookContext) -> None:
        handler = self.handler_for(context.event.type)
        if handler is None:  # stored by an intake that loaded other modules: nothing here to do
            logger.info(
                "%s %s event %s: no handler, nothing to do.",
                context.event.provider,
                context.event.type,
                context.event.event_id,
            )
            return
        await handler(context)


def find_handler(modules: Sequence[FeatureModule], provider: str) -> WebhookHandler | None:
    for module in modules:
        handler = module.webhook_handlers.get(provider)
        if handler is not None:
            return handler
    return None


def handled_types(modules: Sequence[FeatureModule], provider: str) -> Callable[[str], bool]:
    """Whether a loaded module handles an event type of ``provider`` (a plain handler function handles all)."""
    handlers = [module.webhook_handlers[provider] for module in modules if provider in module.webhook_handlers]

    def handles(event_type: str) -> bool:
        return any(getattr(handler, "handles", lambda _: True)(event_type) for handler in handlers)

    return handles
