"""What Clerk's Backend API holds while the soak runs: each entity's newest state, in the Clerk stub process.

Clerk changes an object, then sends its webhook; the soak sends its events in
order, newest first or shuffled, and the endpoint outage drops some, but Clerk
itself always holds the newest version of each object. So every Clerk event,
sent or dropped, first brings the stub up to date: the newest version emitted
so far is put, an older one changes nothing, a deletion removes the object for
good. Clerk deletes an organization's or a user's memberships with it, so a
membership whose organization or user is deleted is removed too (and never put
back): identity reconciliation (``--full``) then finds it gone.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx

from bench.soak.plan import ClerkEntity, Event, Membership, Plan

_PUT = {"user": "put_user", "organization": "put_organization", "organizationMembership": "put_membership"}
_KIND = {"user": "user", "organization": "organization", "organizationMembership": "membership"}


@dataclass
class _Held:
    newest_ms: int | None = None
    deleted: bool = False


class ClerkControl:
    """The only writer of the Clerk stub; one record at a time (a deletion's removals and a put never interleave)."""

    def __init__(self, base_url: str, plan: Plan) -> None:
        self.base_url = base_url
        self.client = httpx.AsyncClient(base_url=base_url, timeout=10.0)
        self.lock = asyncio.Lock()
        self.held: dict[str, _Held] = {}
        self.memberships_of: dict[str, list[Membership]] = {}
        for bundle in plan.bundles:
            for membership in bundle.memberships:
                assert membership.org is not None and membership.user is not None
                for parent in (membership.org, membership.user):
                    self.memberships_of.setdefault(parent.clerk_id, []).append(membership)

    async def close(self) -> None:
        await self.client.aclose()

    def gone(self, entity: ClerkEntity) -> bool:
        """Clerk no longer has it: deleted, or a membership of a deleted organization or user."""
        if self._held(entity).deleted:
            return True
        if isinstance(entity, Membership):
            return any(parent is not None and self._held(parent).deleted for parent in (entity.org, entity.user))
        return False

    async def record(self, entity: ClerkEntity, event: Event) -> None:
        """Clerk's state once ``event`` happened (called before the event is sent or dropped)."""
        async with self.lock:
            held = self._held(entity)
            if event.type.endswith(".deleted"):
                held.deleted = True
                for removed in [entity, *self.memberships_of.get(entity.clerk_id, [])]:
                    await self._command("remove", {"kind": _KIND[removed.kind], "id": removed.clerk_id})
                return
            assert event.payload is not None
            data = event.payload["data"]
            if self.gone(entity) or (held.newest_ms is not None and data["updated_at"] <= held.newest_ms):
                return
            held.newest_ms = data["updated_at"]
            await self._command(_PUT[entity.kind], _object(entity, data))

    def _held(self, entity: ClerkEntity) -> _Held:
        return self.held.setdefault(entity.clerk_id, _Held())

    async def _command(self, name: str, body: dict[str, Any]) -> None:
        for attempt in range(20):
            try:
                response = await self.client.post(f"/_stub/{name}", json=body)
                response.raise_for_status()
                return
            except httpx.TransportError:
                await asyncio.sleep(0.1 * (attempt + 1))
        raise RuntimeError(f"the Clerk stub did not take /_stub/{name}")


def _object(entity: ClerkEntity, data: dict[str, Any]) -> dict[str, Any]:
    """The stub's put_* arguments for the version an event carries (the object Clerk's API lists)."""
    common = {"id": entity.clerk_id, "updated_at": data["updated_at"], "created_at": data["created_at"]}
    if isinstance(entity, Membership):
        assert entity.org is not None and entity.user is not None
        return {**common, "organization": entity.org.clerk_id, "user": entity.user.clerk_id, "role": data["role"]}
    if entity.kind == "organization":
        return {**common, "name": data["name"], "slug": data["slug"]}
    primary = next(a for a in data["email_addresses"] if a["id"] == data["primary_email_address_id"])
    return {
        **common,
        "email": primary["email_address"],
        "first_name": data["first_name"],
        "last_name": data["last_name"],
    }
