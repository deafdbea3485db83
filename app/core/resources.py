"""Shared connections of one process: the API, the worker and the commands build the same set."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis

from app.core.db import Database
from app.core.module import FeatureModule
from app.core.redis import make_redis
from app.core.settings import Settings

if TYPE_CHECKING:
    from app.queue.protocol import MessageQueue


@dataclass
class Resources:
    settings: Settings
    db: Database
    redis: Redis
    modules: Sequence[FeatureModule] = ()
    queue: MessageQueue = field(init=False)
    # Per-process clients a feature module builds once (e.g. the Stripe client), closed with the rest.
    extensions: dict[str, Any] = field(default_factory=dict)
    _closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def add_closer(self, close: Callable[[], Awaitable[None]]) -> None:
        self._closers.append(close)

    @classmethod
    def open(
        cls,
        settings: Settings,
        *,
        pool_size: int = 10,
        modules: Sequence[FeatureModule] = (),
        statement_timeout_seconds: float | None = None,
    ) -> Resources:
        """Build without connecting: connections are made on first use.

        ``modules`` are the feature modules loaded in this process: their job
        classes and webhook handlers are the ones this process can run.
        """
        from app.queue.drivers import create_message_queue

        resources = cls(
            settings=settings,
            db=Database.from_settings(
                settings, pool_size=pool_size, statement_timeout_seconds=statement_timeout_seconds
            ),
            redis=make_redis(settings.require_redis_url()),
            modules=tuple(modules),
        )
        resources.queue = create_message_queue(resources)
        return resources

    async def close(self) -> None:
        for close in reversed(self._closers):
            await close()
        self._closers.clear()
        await self.queue.close()
        await self.redis.aclose()
        await self.db.dispose()
