"""What a provider's event handler receives, and how the intake and the worker find the handler.

Handlers belong to the feature module that owns the data (billing for Stripe,
identity for Clerk) and are declared in that module's ``MODULE.webhook_handlers``,
as :class:`EventRoutes` (types to handlers, each applied in the event's own
transaction) or :class:`SyncedEvents` (types whose state a *sync* of their
subject reads back from the provider, covering every event of that subject at
once). Either is the one list of the types handled: the intake stores an event
only if a loaded module routes its type, and the worker runs what it routes to.

Each also decides, from the verified body, the event's :class:`EventKeys`: its
tenant (whose turn it takes in the provider's queue) and, for synced events,
its subject. The intake stores both with the row. A body may say less than the
module's own tables know (a Stripe thin event names a subscription, billing
knows its customer): :class:`SyncedEvents` may add ``known``, asked after the
body's keys when the event is stored (:func:`stored_keys`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.module import FeatureModule
from app.core.resources import Resources
from app.queue.errors import PermanentError
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
Payload = Mapping[str, Any]
KeyOf = Callable[[str, Payload], str | None]
"""(event type, verified body) -> a key of the event, or None."""
RouteT = TypeVar("RouteT")


def route_for(routes: Mapping[str, RouteT], event_type: str) -> RouteT | None:
    """Exact types (``invoice.paid``) or prefixes written ``customer.subscription.*``.

    An exact type wins over a prefix, and a longer prefix over a shorter one.
    """
    if event_type in routes:
        return routes[event_type]
    prefixes = [p for p in routes if p.endswith(".*") and event_type.startswith(p[:-1])]
    return routes[max(prefixes, key=len)] if prefixes else None


@dataclass(frozen=True, slots=True)
class EventKeys:
    tenant: str | None = None
    """Whose event it is (a Stripe customer, a Clerk organization or user): tenants are served in turn."""
    subject: str | None = None
    """What a sync reads to cover it (``customer:cus_...``), for synced events; None for applied ones."""


def _no_tenant(event_type: str, payload: Payload) -> str | None:
    return None


@dataclass(frozen=True)
class EventRoutes:
    """Event types to handlers, each run in the event's own transaction (see :func:`route_for`)."""

    routes: Mapping[str, WebhookHandler]
    backfill: EventSource | None = None
    """The provider's list of recent events, if it has one: the backfill asks it for events never delivered."""
    tenant_key: KeyOf = _no_tenant
    """Whose event it is, from its verified body; decided by the module that handles the provider's events."""

    def handler_for(self, event_type: str) -> WebhookHandler | None:
        return route_for(self.routes, event_type)

    def handles(self, event_type: str) -> bool:
        return self.handler_for(event_type) is not None

    def keys(self, event_type: str, payload: Payload) -> EventKeys:
        return EventKeys(tenant=self.tenant_key(event_type, payload))

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


class KnownKeys(Protocol):
    """The event's keys refined by what the owning module's tables already hold (the body's ``keys`` otherwise).

    An optimization only, never needed for correctness: a sync of the body's subject learns what this could not.
    """

    async def __call__(self, resources: Resources, event_type: str, payload: Payload, keys: EventKeys) -> EventKeys: ...


class SyncRequest(Protocol):
    """Ask for a sync of ``subject`` that begins after ``received_at`` (the module that owns it decides how).

    ``now``: an operator asks (a retry): a new read as soon as the budget allows, whatever waits already.
    """

    async def __call__(
        self, resources: Resources, subject: str, received_at: datetime, request_id: str | None, *, now: bool = False
    ) -> None: ...


class SyncPreview(Protocol):
    """A dry run's sync of ``subject``: its read and its writes in ``session``, which the caller rolls back.

    It claims no sync and covers no event (the owning module's bookkeeping stays as it was).
    """

    async def __call__(self, resources: Resources, session: AsyncSession, subject: str) -> None: ...


@dataclass(frozen=True)
class SyncedEvents:
    """Event types whose state is read back from the provider by a *sync* of their subject, not applied one by one.

    The event's job only asks for a sync of its subject (``sync``); the sync,
    run by the owning module, reads the subject's current state once, writes
    it, and marks processed in the same transaction every event of that
    subject that arrived before the read began: a burst about one subject costs
    one read. ``subjects`` maps each handled type (or prefix, see
    :func:`route_for`) to the function that names its subject from the body;
    an event whose body names none is set aside when processed.
    """

    subjects: Mapping[str, Callable[[Payload], str | None]]
    sync: SyncRequest
    tenant_key: KeyOf = _no_tenant
    backfill: EventSource | None = None
    preview: SyncPreview | None = None
    """What ``webhooks replay --dry-run`` runs for an event (None: its events have no dry run)."""
    known: KnownKeys | None = None
    """What the module's tables add to the body's keys when the event is stored (``stored_keys``)."""

    def handles(self, event_type: str) -> bool:
        return route_for(self.subjects, event_type) is not None

    def keys(self, event_type: str, payload: Payload) -> EventKeys:
        subject_of = route_for(self.subjects, event_type)
        return EventKeys(
            tenant=self.tenant_key(event_type, payload),
            subject=subject_of(payload) if subject_of is not None else None,
        )

    async def __call__(self, context: WebhookContext) -> None:
        """Only an event whose body names no subject is handled as itself: nothing says what to read."""
        raise PermanentError(
            f"{context.event.provider} {context.event.type} event {context.event.event_id} names no object to read "
            "back (its data.object, or a thin event's related_object, lacks a usable id): nothing says what changed."
        )


EventHandling = EventRoutes | SyncedEvents | WebhookHandler
"""What a module declares for a provider's events: routes applied one by one, synced types, or one handler."""


def find_handler(modules: Sequence[FeatureModule], provider: str) -> EventHandling | None:
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


def event_keys(modules: Sequence[FeatureModule], provider: str) -> Callable[[str, Payload], EventKeys]:
    """The keys of an event of ``provider``, as the module that handles it decides them (none for a plain handler)."""
    handler = find_handler(modules, provider)
    keys = getattr(handler, "keys", None)

    def of(event_type: str, payload: Payload) -> EventKeys:
        return keys(event_type, payload) if keys is not None else EventKeys()

    return of


StoredKeys = Callable[[Resources, str, Payload], Awaitable[EventKeys]]


def stored_keys(modules: Sequence[FeatureModule], provider: str) -> StoredKeys:
    """The keys the inbox stores an event of ``provider`` with (intake, backfill): the body's (:func:`event_keys`),
    refined by what the handling module's tables know (``SyncedEvents.known``)."""
    of = event_keys(modules, provider)
    known = getattr(find_handler(modules, provider), "known", None)

    async def keys(resources: Resources, event_type: str, payload: Payload) -> EventKeys:
        found = of(event_type, payload)
        return found if known is None else await known(resources, event_type, payload, found)

    return keys
