"""A Stripe API stub: a real loopback HTTP server that the real ``stripe`` client talks to.

Billing code is tested through the SDK, HTTP client, timeouts and error mapping
it uses in production; only the server is fake. This module is the server; what
it serves (objects, scheduled faults, the request log) is ``stripe_stub_state``.

Fixture: ``stripe_stub = pytest.fixture(stripe_stub_fixture, name="stripe_stub")`` in a conftest.
Another process (``python -m app.testing.stripe_stub --port 12111``) is driven over HTTP, every
control endpoint a JSON ``POST`` (``{}`` when it takes nothing) but the last:

- ``/_stub/state``: an object, ``{"kind": "subscription", "args": {"customer_id": "cus_1"}}`` (the
  ``put_<kind>`` method's keyword arguments) or ``{"object": {...}}`` as it is;
- ``/_stub/event``: ``{"event": {...}}``, an event ``/v1/events`` lists (``put_event``), or a thin one
  (``"object": "v2.core.event"``) that ``/v2/core/events`` lists (``put_thin_event``);
- ``/_stub/remove``: ``{"kind": "customer", "id": "cus_1"}``;
- ``/_stub/fail``: ``{"path_prefix": "/v1/customers", "status": 500, "times": 1}``;
- ``/_stub/rate_limit``: ``{"path_prefix": "/v1/customers", "retry_after": 2, "times": 1}`` (429s);
- ``/_stub/slow``: ``{"path_prefix": "/v1/customers", "seconds": 0.5, "times": 1}``;
- ``/_stub/enforce_rate_limit``: ``{"per_second": 25}``, every API request (/v1, /v2) past it in any
  second answers 429 (``null``: no limit);
- ``/_stub/clear_faults``: every scheduled fault gone; ``/_stub/reset``: everything gone;
- ``GET /_stub/requests``: ``{"requests": [[method, path], ...]}``, oldest first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import threading
from collections.abc import Callable, Iterator
from typing import Any

from litestar import Litestar, Request, Response, Router, get, post
from litestar.exceptions import ClientException, MethodNotAllowedException, NotFoundException
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, FromQuery, JSONBody

from app.testing.loopback import LoopbackServer
from app.testing.stripe_stub_state import SEGMENTS, THIN_EVENTS, StripeStubState

__all__ = ["StripeStub", "stripe_stub_fixture"]

_RATE_LIMIT = (
    "Request rate limit exceeded. You can learn more about rate limits here https://stripe.com/docs/rate-limits."
)


def _answer(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Response[Any]:
    return Response(body, status_code=status, headers={"Request-Id": f"req_{secrets.token_hex(7)}", **(headers or {})})


def _array(request: Request[Any, Any, Any], name: str) -> list[str]:
    """A list parameter as Stripe's SDK encodes it (``types[0]=a&types[1]=b``) or as ``types[]=a``."""
    prefix = f"{name}["
    query = request.query_params.multi_items()
    items = [(key[len(prefix) : -1], value) for key, value in query if key.startswith(prefix) and key.endswith("]")]
    listed = [(index, value) for index, value in items if index.isdigit() or not index]
    # In the order of their indexes (a query string's order may not survive its parsing).
    return [value for _, value in sorted(listed, key=lambda item: int(item[0] or 0))]


def _rate_limited(retry_after: int) -> Response[Any]:
    body = {"error": {"type": "invalid_request_error", "code": "rate_limit", "message": _RATE_LIMIT}}
    return _answer(429, body, {"Retry-After": str(retry_after)})


def _error(status: int, message: str, type_: str = "invalid_request_error", **extra: str) -> Response[Any]:
    """Stripe's error body: the SDK picks its exception class by status, type and code."""
    return _answer(status, {"error": {"type": type_, "message": message, **extra}})


class StripeStub(StripeStubState, LoopbackServer):
    """Serves the Stripe endpoints billing code reads, from the state tests put in (``StripeStubState``).

    Every method is thread-safe: tests call them while the server thread answers.
    """

    name = "stripe-stub"

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        StripeStubState.__init__(self)
        LoopbackServer.__init__(self, host=host, port=port)

    # serving -----------------------------------------------------------
    async def _gate(self, request: Request[Any, Any, Any]) -> Response[Any] | None:
        """Runs before every API handler (/v1, /v2): log, authenticate like Stripe, then apply a scheduled fault."""
        self._log_request(request.method, request.url.path)
        if not request.headers.get("authorization", "").startswith(("Bearer sk_", "Bearer rk_")):
            return _error(401, "You did not provide a valid API key. Use 'Authorization: Bearer sk_...'.")
        if self._over_rate_limit():
            return _rate_limited(1)
        fault = self._take_fault(request.url.path)
        if fault is None:
            return None
        if fault.mode == "slow":
            await asyncio.sleep(fault.seconds)
            return None
        if fault.mode == "rate_limit":
            return _rate_limited(fault.retry_after)
        return _error(fault.status, "An unknown error occurred (stub fault).", "api_error")

    def _retrieve(self, kind: str, object_id: str, expand: list[str] | None = None) -> Response[Any]:
        body = self._find(kind, object_id)
        if body is None:
            return _error(404, f"No such {kind}: '{object_id}'", code="resource_missing", param="id")
        if kind == "customer" and "subscriptions" in (expand or []) and not body.get("deleted"):
            body = self._expanded_customer(body)
        if kind == "charge" and "refunds" in (expand or []):
            body = self._expanded_charge(body)
        return _answer(200, body)

    def _list_subscriptions(self, customer: str | None, status: str | None, limit: int) -> Response[Any]:
        """Newest first; without ``status`` Stripe leaves canceled ones out, ``all`` keeps them."""
        subs = self._newest_first("subscription")
        subs = [s for s in subs if customer is None or s["customer"] == customer]
        if status is None:
            subs = [s for s in subs if s["status"] != "canceled"]
        elif status != "all":
            subs = [s for s in subs if s["status"] == status]
        body = {
            "object": "list",
            "data": subs[:limit],
            "has_more": len(subs) > limit,
            "url": "/v1/subscriptions",
        }
        return _answer(200, body)

    def _put_any_event(self, event: dict[str, Any]) -> dict[str, Any]:
        return self.put_thin_event(event) if event.get("object") == THIN_EVENTS else self.put_event(event)

    def _retrieve_handler(self, kind: str) -> HTTPRouteHandler:
        async def retrieve(object_id: FromPath[str], request: Request[Any, Any, Any]) -> Response[Any]:
            return self._retrieve(kind, object_id, _array(request, "expand"))

        return get(f"/{SEGMENTS[kind]}/{{object_id:str}}", name=f"retrieve {kind}")(retrieve)

    def _api_router(self) -> Router:
        @get("/subscriptions")
        async def list_subscriptions(
            customer: FromQuery[str | None] = None,
            status: FromQuery[str | None] = None,
            limit: FromQuery[int] = 10,
        ) -> Response[Any]:
            return self._list_subscriptions(customer, status, limit)

        async def gate(request: Request[Any, Any, Any]) -> Response[Any] | None:
            return await self._gate(request)  # a closure: Litestar deep-copies bound methods (and the lock)

        @get("/events")
        async def list_events(request: Request[Any, Any, Any]) -> Response[Any]:
            query = request.query_params

            def number(name: str) -> int | None:
                value = query.get(name)
                return int(value) if value is not None else None

            listed = self._list_events(
                number("created[gte]"),
                number("created[lte]"),
                _array(request, "types"),
                number("limit") or 10,
                query.get("starting_after"),
            )
            return _answer(200, listed)

        handlers = [list_subscriptions, list_events, *(self._retrieve_handler(kind) for kind in SEGMENTS)]
        return Router("/v1", route_handlers=handlers, before_request=gate)

    def _v2_router(self) -> Router:
        """``/v2/core/events``: thin events, filtered by ``types``, ``created`` (RFC 3339) and paged by ``page``."""

        async def gate(request: Request[Any, Any, Any]) -> Response[Any] | None:
            return await self._gate(request)

        @get("/core/events")
        async def list_thin_events(request: Request[Any, Any, Any]) -> Response[Any]:
            query = request.query_params
            listed = self._list_thin_events(
                query.get("created[gte]"),
                query.get("created[lte]"),
                _array(request, "types"),
                int(query.get("limit") or 20),
                query.get("page"),
            )
            return _answer(200, listed)

        return Router("/v2", route_handlers=[list_thin_events], before_request=gate)

    def _control_router(self) -> Router:
        def command(path: str, action: Callable[..., Any]) -> HTTPRouteHandler:
            async def run(data: JSONBody[dict[str, Any]]) -> Any:
                try:
                    result = action(**data)
                except (KeyError, TypeError, ValueError) as exc:
                    raise ClientException(detail=f"Bad stub command {path}: {exc!r}") from exc
                return {"ok": True} if result is None else result

            return post(path, status_code=200, name=f"stub {path}")(run)

        @get("/requests")
        async def requests() -> dict[str, Any]:
            return {"requests": [list(r) for r in self.requests]}

        handlers = [
            command("/state", lambda **body: self.apply_state(body)),
            command("/event", lambda **body: self._put_any_event(body["event"])),
            *(
                command(f"/{name}", getattr(self, name))
                for name in ("remove", "fail", "rate_limit", "slow", "clear_faults", "reset", "enforce_rate_limit")
            ),
            requests,
        ]
        return Router("/_stub", route_handlers=handlers)

    def _build_app(self) -> Litestar:
        def unknown_route(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
            return _error(404, f"Unrecognized request URL ({request.method}: {request.url.path}).")

        return Litestar(
            route_handlers=[self._api_router(), self._v2_router(), self._control_router()],
            exception_handlers={NotFoundException: unknown_route, MethodNotAllowedException: unknown_route},
            openapi_config=None,
        )


def stripe_stub_fixture() -> Iterator[StripeStub]:
    """A running stub for one test; wrap with ``pytest.fixture`` in a conftest."""
    with StripeStub() as stub:
        yield stub


def main(argv: list[str] | None = None) -> None:
    """Serves the stub in the foreground for local demos and soak runs until Ctrl-C."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=12111)
    args = parser.parse_args(argv)
    with StripeStub(host=args.host, port=args.port) as stub:
        print(stub.base_url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
