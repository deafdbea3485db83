"""The one place that talks to Clerk's Backend API (``clerk-backend-api``, Clerk's official SDK): list everything.

Reconciliation reads every user, organization and organization membership,
every page, as plain dicts shaped like the ``data`` of Clerk's webhook events
(the same objects), so ``clerk_sync`` applies either. ``CLERK_API_BASE``
points it elsewhere (a stub in tests). No SDK retries: a failed run is retried
by the job layer, and the next run starts over.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
from clerk_backend_api import Clerk, models
from clerk_backend_api.utils import BackoffStrategy, RetryConfig

from app.core.settings import Settings
from app.queue.errors import error_for_http_status

PAGE_SIZE = 100
_NO_RETRIES = RetryConfig("off", BackoffStrategy(1, 1, 1.0, 1), False)


class ClerkGateway:
    def __init__(self, settings: Settings) -> None:
        if not settings.clerk_secret_key:
            raise RuntimeError("CLERK_SECRET_KEY is not set: Clerk reconciliation needs the Backend API key.")
        self.base_url = settings.clerk_api_base
        self.timeout_ms = int(settings.stripe_api_timeout_seconds * 1000)
        self._http = httpx.AsyncClient(timeout=settings.stripe_api_timeout_seconds)
        self._clerk = Clerk(
            bearer_auth=settings.clerk_secret_key,
            server_url=self.base_url,
            async_client=self._http,
            retry_config=_NO_RETRIES,
        )

    async def close(self) -> None:
        await self._http.aclose()

    def users(self) -> AsyncIterator[dict[str, Any]]:
        async def page(offset: int) -> list[Any]:
            return await self._clerk.users.list_async(
                request={"limit": PAGE_SIZE, "offset": offset, "order_by": "+created_at"}, timeout_ms=self.timeout_ms
            )

        return self._every("users", page)

    def organizations(self) -> AsyncIterator[dict[str, Any]]:
        async def page(offset: int) -> list[Any]:
            listed = await self._clerk.organizations.list_async(
                limit=PAGE_SIZE, offset=offset, order_by="+created_at", timeout_ms=self.timeout_ms
            )
            return list(listed.data)

        return self._every("organizations", page)

    def memberships(self) -> AsyncIterator[dict[str, Any]]:
        async def page(offset: int) -> list[Any]:
            listed = await self._clerk.users.get_instance_organization_memberships_async(
                limit=PAGE_SIZE, offset=offset, order_by="+created_at", timeout_ms=self.timeout_ms
            )
            return list(listed.data)

        return self._every("organization memberships", page)

    async def _every(self, what: str, page: Callable[[int], Awaitable[list[Any]]]) -> AsyncIterator[dict[str, Any]]:
        """Every object, a page at a time by offset, until a page comes back short."""
        offset = 0
        while True:
            try:
                objects = await page(offset)
            except models.ClerkBaseError as exc:
                hint = " Check CLERK_SECRET_KEY." if exc.status_code in (401, 403) else ""
                raise error_for_http_status(exc.status_code, f"Clerk answered listing {what}.{hint}") from exc
            except models.NoResponseError as exc:
                raise ConnectionError(f"Clerk ({self.base_url}) did not answer listing {what}; retried.") from exc
            for obj in objects:
                yield obj.model_dump()
            if len(objects) < PAGE_SIZE:
                return
            offset += PAGE_SIZE
