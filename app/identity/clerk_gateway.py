"""The one place that talks to Clerk's Backend API (``clerk-backend-api``, Clerk's official SDK): list everything.

Reconciliation reads every user, organization and organization membership,
every page, as plain dicts shaped like the ``data`` of Clerk's webhook events
(the same objects), so ``clerk_sync`` applies either; and reads one object
again (``user``, ``organization``, ``membership``) to confirm that one missing
from a listing is really gone. ``CLERK_API_BASE`` points it elsewhere (a stub
in tests). No SDK retries: a failed run is retried by the job layer, and the
next run starts over. Every call passes the ``clerk`` upstream (``CLERK``: its
rate across the fleet, its outage hold and an operator's pause).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from app.core.settings import Settings
from app.queue.errors import error_for_http_status
from app.queue.upstreams import Upstream, UpstreamCalls

if TYPE_CHECKING:
    from clerk_backend_api import models

PAGE_SIZE = 100
CLERK = Upstream("clerk", per_second=10)
"""Clerk's Backend API allows a development instance 100 requests in 10 s (a production one ten times more):
the starter keeps under the smaller, which its nightly reconciliation never needs to exceed."""


class _Dumped(Protocol):
    def model_dump(self) -> dict[str, Any]: ...


class ClerkGateway:
    def __init__(self, settings: Settings, upstream: UpstreamCalls) -> None:
        if not settings.clerk_secret_key:
            raise RuntimeError("CLERK_SECRET_KEY is not set: Clerk reconciliation needs the Backend API key.")
        self.base_url = settings.clerk_api_base
        self.upstream = upstream
        self.timeout_ms = int(settings.stripe_api_timeout_seconds * 1000)
        # The SDK is imported by the process that reads Clerk (a reconciliation), not by every one that loads
        # identity: with its JWT and crypto dependencies it costs 0.4 s of CPU to import.
        from clerk_backend_api import Clerk, models
        from clerk_backend_api.utils import BackoffStrategy, RetryConfig

        self._models = models
        self._http = httpx.AsyncClient(timeout=settings.stripe_api_timeout_seconds)
        self._clerk = Clerk(
            bearer_auth=settings.clerk_secret_key,
            server_url=self.base_url,
            async_client=self._http,
            retry_config=RetryConfig("off", BackoffStrategy(1, 1, 1.0, 1), False),  # no SDK retries
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

    async def user(self, user_id: str) -> dict[str, Any] | None:
        """The user as Clerk has it now; None only when Clerk answers 404 (it no longer exists)."""
        return await self._one(
            f"user {user_id}", lambda: self._clerk.users.get_async(user_id=user_id, timeout_ms=self.timeout_ms)
        )

    async def organization(self, organization_id: str) -> dict[str, Any] | None:
        """The organization as Clerk has it now; None only when Clerk answers 404."""
        return await self._one(
            f"organization {organization_id}",
            lambda: self._clerk.organizations.get_async(organization_id=organization_id, timeout_ms=self.timeout_ms),
        )

    async def membership(self, membership_id: str, organization_id: str, user_id: str) -> dict[str, Any] | None:
        """The membership as Clerk has it now; None when its organization answers 404 or does not list it.

        Clerk has no read of one membership by id: this is the organization's
        memberships of that one user (a single short answer).
        """

        async def read() -> _Dumped | None:
            listed = await self._clerk.organization_memberships.list_async(
                organization_id=organization_id, user_id=[user_id], limit=PAGE_SIZE, timeout_ms=self.timeout_ms
            )
            return next((found for found in listed.data if found.id == membership_id), None)

        return await self._one(f"the memberships of user {user_id} in organization {organization_id}", read)

    async def _one(self, what: str, read: Callable[[], Awaitable[_Dumped | None]]) -> dict[str, Any] | None:
        async with self.upstream.call(what):
            try:
                found = await read()
            except self._models.ClerkBaseError as exc:
                if exc.status_code == 404:
                    return None
                raise self._error(f"reading {what}", exc) from exc
            except self._models.NoResponseError as exc:
                raise ConnectionError(f"Clerk ({self.base_url}) did not answer reading {what}; retried.") from exc
        return None if found is None else found.model_dump()

    async def _every(self, what: str, page: Callable[[int], Awaitable[list[Any]]]) -> AsyncIterator[dict[str, Any]]:
        """Every object, a page at a time by offset, until a page comes back short."""
        offset = 0
        while True:
            async with self.upstream.call(f"listing {what}"):
                try:
                    objects = await page(offset)
                except self._models.ClerkBaseError as exc:
                    raise self._error(f"listing {what}", exc) from exc
                except self._models.NoResponseError as exc:
                    raise ConnectionError(f"Clerk ({self.base_url}) did not answer listing {what}; retried.") from exc
            for obj in objects:
                yield obj.model_dump()
            if len(objects) < PAGE_SIZE:
                return
            offset += PAGE_SIZE

    @staticmethod
    def _error(doing: str, exc: models.ClerkBaseError) -> Exception:
        hint = " Check CLERK_SECRET_KEY." if exc.status_code in (401, 403) else ""
        return error_for_http_status(exc.status_code, f"Clerk answered {doing}.{hint}")
