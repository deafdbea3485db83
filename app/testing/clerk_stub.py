"""A Clerk Backend API stub: a real loopback HTTP server that Clerk's official SDK talks to.

It serves what reconciliation reads: ``GET /v1/users`` (a bare array),
``GET /v1/organizations`` and ``GET /v1/organization_memberships`` (``{data,
total_count}``), paged by ``limit`` and ``offset``, oldest first; one object
again: ``GET /v1/users/{id}``, ``GET /v1/organizations/{id}`` and ``GET
/v1/organizations/{id}/memberships?user_id=...`` (404 in Clerk's error shape
when the user or organization is not there). Without ``Authorization: Bearer
sk_...`` it answers 401 as Clerk does. Objects start from real-shaped fixtures
(``data/clerk_api_objects.json``) with the ids and fields a test gives; times
are unix milliseconds, ``updated_at`` defaults to now.

Faults and races: ``fail(path_prefix, status=500, times=1)`` makes the next
requests under a path answer an error; ``when_listed(kind, offset, action)``
runs ``action`` once right after the page of ``kind`` at ``offset`` was read
(e.g. ``remove`` an object while a listing is under way, so the pages shift).

Point the app at it with ``CLERK_API_BASE=clerk_stub.base_url + "/v1"`` and any
``CLERK_SECRET_KEY`` starting with ``sk_``. Fixture: ``clerk_stub`` (``app.testing.fixtures``).
Another process (``python -m app.testing.clerk_stub --port 12112``, which prints its base URL)
is driven over HTTP: ``POST /_stub/put_user``, ``/_stub/put_organization`` and
``/_stub/put_membership`` with the keyword arguments of those methods
(``{"id": "user_1", "email": "ada@example.org", "updated_at": 1700000000000}``);
``POST /_stub/remove`` ``{"kind": "user", "id": "user_1"}``; ``POST /_stub/fail``
``{"path_prefix": "/v1/users", "status": 500, "times": 1}``; ``POST /_stub/clear_faults``;
``POST /_stub/reset``; ``GET /_stub/requests``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

from litestar import Litestar, Request, Response, Router, get, post
from litestar.exceptions import ClientException
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, JSONBody

from app.testing.loopback import LoopbackServer

__all__ = ["ClerkStub", "clerk_stub_fixture"]

_REQUEST_LOG_SIZE = 100_000  # bounded, as the Stripe stub's: a long soak run cannot grow it without end
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


def _clerk_error(status: int, code: str, message: str, long_message: str) -> Response[Any]:
    """Clerk's error body (``{"errors": [...]}``): the SDK raises ``ClerkErrors`` from it."""
    return Response({"errors": [{"message": message, "long_message": long_message, "code": code}]}, status_code=status)


def _not_found(what: str) -> Response[Any]:
    return _clerk_error(404, "resource_not_found", "not found", f"{what} not found")


class ClerkStub(LoopbackServer):
    """Thread-safe: tests put objects while the server thread answers."""

    name = "clerk-stub"

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host=host, port=port)
        self._lock = threading.Lock()
        self._objects: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in _KINDS}
        self._requests: deque[tuple[str, str]] = deque(maxlen=_REQUEST_LOG_SIZE)
        self._faults: list[dict[str, Any]] = []
        self._listed: list[tuple[str, int, Callable[[], Any]]] = []

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
        if kind not in _KINDS:
            raise KeyError(f"Unknown Clerk stub kind {kind!r}; use one of {sorted(_KINDS)}")
        with self._lock:
            self._objects[kind].pop(id, None)

    def fail(self, path_prefix: str, status: int = 500, times: int | None = 1) -> None:
        """The next ``times`` requests under ``path_prefix`` (e.g. ``/v1/users``) answer ``status`` (None: until
        ``clear_faults``)."""
        with self._lock:
            self._faults.append({"path_prefix": path_prefix, "status": status, "times": times})

    def when_listed(self, kind: str, offset: int, action: Callable[[], Any]) -> None:
        """Run ``action`` once, right after the page of ``kind`` starting at ``offset`` was read (not over HTTP)."""
        if kind not in _KINDS:
            raise KeyError(f"Unknown Clerk stub kind {kind!r}; use one of {sorted(_KINDS)}")
        with self._lock:
            self._listed.append((kind, offset, action))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
            self._listed.clear()

    def reset(self) -> None:
        with self._lock:
            for objects in self._objects.values():
                objects.clear()
            self._requests.clear()
            self._faults.clear()
            self._listed.clear()

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
            page = copy.deepcopy(objects[offset : offset + limit])
            due = [hook for hook in self._listed if hook[:2] == (kind, offset)]
            self._listed = [hook for hook in self._listed if hook not in due]
        for _, _, action in due:
            action()
        return page, len(objects)

    def _find(self, kind: str, id: str) -> dict[str, Any] | None:
        with self._lock:
            found = self._objects[kind].get(id)
            return copy.deepcopy(found) if found is not None else None

    def _take_fault(self, path: str) -> int | None:
        with self._lock:
            for fault in self._faults:
                if path.startswith(fault["path_prefix"]):
                    if fault["times"] is not None:
                        fault["times"] -= 1
                        if fault["times"] <= 0:
                            self._faults.remove(fault)
                    return int(fault["status"])
        return None

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
            status = self._take_fault(request.url.path)
            if status is not None:
                return _clerk_error(status, "internal_clerk_error", "Oops", "Something went wrong (stub fault).")
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

        @get("/users/{user_id:str}")
        async def user(user_id: FromPath[str]) -> Any:
            return self._find("user", user_id) or _not_found(f"user {user_id}")

        @get("/organizations/{organization_id:str}")
        async def organization(organization_id: FromPath[str]) -> Any:
            return self._find("organization", organization_id) or _not_found(f"organization {organization_id}")

        @get("/organizations/{organization_id:str}/memberships")
        async def members(organization_id: FromPath[str], request: Request[Any, Any, Any]) -> Any:
            """The organization's memberships (of the ``user_id`` values given, if any); 404 for an unknown one."""
            if self._find("organization", organization_id) is None:
                return _not_found(f"organization {organization_id}")
            users = {value for key, value in request.query_params.multi_items() if key in ("user_id", "user_id[]")}
            with self._lock:
                data = [
                    copy.deepcopy(m)
                    for m in self._objects["membership"].values()
                    if m["organization"]["id"] == organization_id
                    and (not users or m["public_user_data"]["user_id"] in users)
                ]
            return {"data": data, "total_count": len(data)}

        handlers = [users, organizations, memberships, user, organization, members]
        api = Router("/v1", route_handlers=handlers, before_request=gate)
        return Litestar(route_handlers=[api, self._control_router()], openapi_config=None)

    def _control_router(self) -> Router:
        """``/_stub/*``: the methods above over HTTP, for a stub in another process (a soak run, a demo)."""

        def command(name: str, action: Callable[..., Any]) -> HTTPRouteHandler:
            async def run(data: JSONBody[dict[str, Any]]) -> Any:
                try:
                    result = action(**data)
                except (KeyError, TypeError, ValueError) as exc:
                    raise ClientException(detail=f"Bad Clerk stub command /_stub/{name}: {exc!r}") from exc
                return {"ok": True} if result is None else result

            return post(f"/{name}", status_code=200, name=f"clerk stub {name}")(run)

        @get("/requests")
        async def requests() -> dict[str, Any]:
            return {"requests": [list(request) for request in self.requests]}

        names = ("put_user", "put_organization", "put_membership", "remove", "fail", "clear_faults", "reset")
        return Router("/_stub", route_handlers=[*(command(name, getattr(self, name)) for name in names), requests])


def clerk_stub_fixture() -> Iterator[ClerkStub]:
    """A running stub; wrap with ``pytest.fixture`` in a conftest (``app.testing.fixtures`` does)."""
    with ClerkStub() as stub:
        yield stub


def main(argv: list[str] | None = None) -> None:
    """Serves the stub in the foreground (printing its base URL) for soak runs and demos, until Ctrl-C or SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=12112, help="0: any free port")
    args = parser.parse_args(argv)
    with ClerkStub(host=args.host, port=args.port) as stub:
        print(stub.base_url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
