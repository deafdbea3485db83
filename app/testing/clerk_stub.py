"""A Clerk Backend API stub: a real loopback HTTP server that Clerk's official SDK talks to.

It serves what reconciliation reads: ``GET /v1/users`` (a bare array),
``GET /v1/organizations`` and ``GET /v1/organization_memberships`` (``{data,
total_count}``), paged by ``limit`` and ``offset``, oldest first; without
``Authorization: Bearer sk_...`` it answers 401 as Clerk does. Objects start
from real-shaped fixtures (``data/clerk_api_objects.json``) with the ids and
fields a test gives; times are unix milliseconds, ``updated_at`` defaults to now.

Point the app at it with ``CLERK_API_BASE=clerk_stub.base_url + "/v1"`` and any
``CLERK_SECRET_KEY`` starting with ``sk_``. Fixture: ``clerk_stub`` (``app.testing.fixtures``).
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from litestar import Litestar, Request, Response, Router, get

from app.testing.loopback import LoopbackServer

__all__ = ["ClerkStub", "clerk_stub_fixture"]

_KINDS = {
    "user": "GET /v1/users",
    "organization": "GET /v1/organizations",
    "membership": "GET /v1/organization_memberships",
}


@cache
def _fixtures() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((Path(__file__).parent / "data" / "clerk_api_objects.json").read_text())
    return data


def _fixture(kind: str) -> dict[str, Any]:
    listed = _fixtures()[_KINDS[kind]]
    return copy.deepcopy(listed[0] if isinstance(listed, list) else listed["data"][0])


def _now_ms() -> int:
    return int(time.time() * 1000)


class ClerkStub(LoopbackServer):
    """Thread-safe: tests put objects while the server thread answers."""

    name = "clerk-stub"

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host=host, port=port)
        self._lock = threading.Lock()
        self._objects: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in _KINDS}
        self._requests: list[tuple[str, str]] = []

    # state ---------------------------------------------------------------
    def put_user(
        self, id: str, *, email: str | None = None, updated_at: int | None = None, **fields: Any
    ) -> dict[str, Any]:
        user = {**_fixture("user"), "id": id, "updated_at": updated_at or _now_ms(), **fields}
        if email is not None:
            address = {**user["email_addresses"][0], "id": f"idn_{id}", "email_address": email}
            user.update(email_addresses=[address], primary_email_address_id=address["id"])
        return self._put("user", user)

    def put_organization(self, id: str, *, updated_at: int | None = None, **fields: Any) -> dict[str, Any]:
        return self._put(
            "organization", {**_fixture("organization"), "id": id, "updated_at": updated_at or _now_ms(), **fields}
        )

    def put_membership(
        self,
        id: str,
        *,
        organization: str,
        user: str,
        role: str = "org:member",
        updated_at: int | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        membership = _fixture("membership")
        membership["organization"] = {**membership["organization"], "id": organization}
        membership["public_user_data"] = {**membership["public_user_data"], "user_id": user}
        return self._put(
            "membership", {**membership, "id": id, "role": role, "updated_at": updated_at or _now_ms(), **fields}
        )

    def remove(self, kind: str, id: str) -> None:
        """Clerk no longer has the object (deleted): it is listed no more."""
        with self._lock:
            self._objects[kind].pop(id, None)

    def reset(self) -> None:
        with self._lock:
            for objects in self._objects.values():
                objects.clear()
            self._requests.clear()

    @property
    def requests(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self._requests)

    def _put(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        obj.setdefault("created_at", obj["updated_at"])
        with self._lock:
            self._objects[kind][str(obj["id"])] = copy.deepcopy(obj)
        return obj

    def _page(self, kind: str, request: Request[Any, Any, Any]) -> tuple[list[dict[str, Any]], int]:
        limit = int(request.query_params.get("limit") or 10)
        offset = int(request.query_params.get("offset") or 0)
        with self._lock:
            objects = sorted(self._objects[kind].values(), key=lambda obj: (obj["created_at"], obj["id"]))
            return copy.deepcopy(objects[offset : offset + limit]), len(objects)

    # serving ---------------------------------------------------------------
    def _build_app(self) -> Litestar:
        async def gate(request: Request[Any, Any, Any]) -> Response[Any] | None:
            with self._lock:
                self._requests.append((request.method, request.url.path))
            if not request.headers.get("authorization", "").startswith("Bearer sk_"):
                body = {
                    "errors": [
                        {
                            "message": "Unauthorized",
                            "long_message": "Invalid API key.",
                            "code": "authentication_invalid",
                        }
                    ]
                }
                return Response(body, status_code=401)
            return None

        @get("/users")
        async def users(request: Request[Any, Any, Any]) -> list[dict[str, Any]]:
            return self._page("user", request)[0]

        @get("/organizations")
        async def organizations(request: Request[Any, Any, Any]) -> dict[str, Any]:
            data, total = self._page("organization", request)
            return {"data": data, "total_count": total}

        @get("/organization_memberships")
        async def memberships(request: Request[Any, Any, Any]) -> dict[str, Any]:
            data, total = self._page("membership", request)
            return {"data": data, "total_count": total}

        api = Router("/v1", route_handlers=[users, organizations, memberships], before_request=gate)
        return Litestar(route_handlers=[api], openapi_config=None)


def clerk_stub_fixture() -> Iterator[ClerkStub]:
    """A running stub; wrap with ``pytest.fixture`` in a conftest (``app.testing.fixtures`` does)."""
    with ClerkStub() as stub:
        yield stub
