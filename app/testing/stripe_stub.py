"""A Stripe API stub: a real loopback HTTP server that the real ``stripe`` client talks to.

Billing code is tested through the SDK, HTTP client, timeouts and error mapping
it uses in production; only the server is fake. Objects have the fixtures'
shapes (``deliveries.stripe_object``) with the ids and state a test puts in;
faults (5xx, 429, slowness) are scheduled per path prefix.

Fixture: ``stripe_stub = pytest.fixture(stripe_stub_fixture, name="stripe_stub")`` in a conftest.
Another process (``python -m app.testing.stripe_stub --port 12111``) is driven over HTTP:
``POST /_stub/state`` ``{"kind": "subscription", "args": {"customer_id": "cus_1"}}`` or
``{"object": {...}}``; ``POST /_stub/remove`` ``{"kind", "id"}``; ``POST /_stub/fail``,
``/_stub/rate_limit``, ``/_stub/slow`` with the keyword arguments of those methods;
``POST /_stub/reset``; ``GET /_stub/requests``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from litestar import Litestar, Request, Response, Router, get, post
from litestar.exceptions import ClientException, MethodNotAllowedException, NotFoundException
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, FromQuery, JSONBody

from app.testing.deliveries import stripe_object, stripe_subscription

__all__ = ["StripeStub", "stripe_stub_fixture"]

# Stored kind (the object's "object" field) -> its URL segment under /v1.
_SEGMENTS: dict[str, str] = {
    "customer": "customers",
    "subscription": "subscriptions",
    "checkout.session": "checkout/sessions",
    "dispute": "disputes",
    "refund": "refunds",
    "charge": "charges",
    "radar.early_fraud_warning": "radar/early_fraud_warnings",
}
_ALIASES = {"checkout_session": "checkout.session", "early_fraud_warning": "radar.early_fraud_warning"}
# Quiet and without lifespan; stop() sets force_exit, so requests sleeping in `slow` do not delay it.
_SERVER_OPTIONS: dict[str, Any] = {
    "loop": "asyncio",
    "lifespan": "off",
    "log_level": "warning",
    "access_log": False,
}
_REQUEST_LOG_SIZE = 100_000  # bounded so a long soak run cannot grow it without end
_RATE_LIMIT = (
    "Request rate limit exceeded. You can learn more about rate limits here https://stripe.com/docs/rate-limits."
)


@dataclass
class _Fault:
    mode: str  # "fail", "rate_limit" or "slow"
    path_prefix: str
    times: int | None  # None: until reset()
    status: int = 500
    retry_after: int = 2
    seconds: float = 0.0


def _kind(name: str) -> str:
    kind = _ALIASES.get(name, name)
    if kind not in _SEGMENTS:
        raise KeyError(f"Unknown Stripe stub kind {name!r}; use one of {sorted(_SEGMENTS)}")
    return kind


def _answer(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Response[Any]:
    return Response(body, status_code=status, headers={"Request-Id": f"req_{secrets.token_hex(7)}", **(headers or {})})


def _error(status: int, message: str, type_: str = "invalid_request_error", **extra: str) -> Response[Any]:
    """Stripe's error body: the SDK picks its exception class by status, type and code."""
    return _answer(status, {"error": {"type": type_, "message": message, **extra}})


class StripeStub:
    """Serves the Stripe endpoints billing code reads, from state tests put in.

    Every method is thread-safe: tests call them while the server thread answers.
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._host, self._port = host, port
        self._lock = threading.Lock()
        self._objects: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in _SEGMENTS}
        self._faults: list[_Fault] = []
        self._requests: deque[tuple[str, str]] = deque(maxlen=_REQUEST_LOG_SIZE)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    # lifecycle -------------------------------------------------------------
    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("StripeStub is not running: call start() or use it as a context manager")
        return f"http://{self._host}:{self._port}"

    def start(self) -> StripeStub:
        """Binds first (port 0 picks a free one), so the URL is known before serving begins."""
        # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only then; proto 0 adds ~40 ms (Nagle) per answer.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, self._port))
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(self._build_app(), **_SERVER_OPTIONS)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="stripe-stub", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"StripeStub failed to start on {self._host}:{self._port}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stops serving at once; requests still sleeping in `slow` are cut off."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = self._server.force_exit = True
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> StripeStub:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # state ----------------------------------------------------------------
    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Stores (or replaces) any object of a served kind, keyed by its ``object`` and ``id``."""
        stored = copy.deepcopy(obj)
        with self._lock:
            self._objects[_kind(str(stored["object"]))][str(stored["id"])] = stored
        return copy.deepcopy(stored)

    def put_customer(self, id: str, **fields: Any) -> dict[str, Any]:
        return self.put(stripe_object("customer", id=id, **fields))

    def delete_customer(self, id: str) -> dict[str, Any]:
        """Stripe still answers 200 for a deleted customer, with only ``deleted: true`` left."""
        return self.put({"id": id, "object": "customer", "deleted": True})

    def put_subscription(
        self,
        customer_id: str,
        *,
        id: str | None = None,
        status: str = "active",
        quantity: int = 3,
        price_id: str = "price_seats",
        current_period_end: int | None = None,
        cancel_at_period_end: bool = False,
        **fields: Any,
    ) -> dict[str, Any]:
        """One seat-priced item; see ``deliveries.stripe_subscription``."""
        return self.put(
            stripe_subscription(
                customer_id,
                id=id,
                status=status,
                quantity=quantity,
                price_id=price_id,
                current_period_end=current_period_end,
                cancel_at_period_end=cancel_at_period_end,
                **fields,
            )
        )

    def put_checkout_session(
        self, id: str, *, customer: str | None = None, client_reference_id: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        """A completed subscription checkout, the kind ``checkout.session.completed`` names."""
        links = {"customer": customer, "client_reference_id": client_reference_id}
        done = {"mode": "subscription", "status": "complete", "payment_status": "paid"}
        return self.put(stripe_object("checkout.session", id=id, **{**done, **links, **fields}))

    def put_dispute(self, id: str, **fields: Any) -> dict[str, Any]:
        return self.put(stripe_object("dispute", id=id, **fields))

    def put_refund(self, id: str, **fields: Any) -> dict[str, Any]:
        return self.put(stripe_object("refund", id=id, **fields))

    def put_charge(self, id: str, **fields: Any) -> dict[str, Any]:
        return self.put(stripe_object("charge", id=id, **fields))

    def put_early_fraud_warning(self, id: str, **fields: Any) -> dict[str, Any]:
        return self.put(stripe_object("radar.early_fraud_warning", id=id, **fields))

    def remove(self, kind: str, id: str) -> None:
        """Forgets an object: the API then answers 404 ``resource_missing`` for it."""
        with self._lock:
            self._objects[_kind(kind)].pop(id, None)

    # faults ---------------------------------------------------------------
    def fail(self, path_prefix: str, status: int = 500, times: int | None = 1) -> None:
        """The next `times` requests under `path_prefix` answer `status` (None: until reset)."""
        self._add_fault(_Fault("fail", path_prefix, times, status=status))

    def rate_limit(self, path_prefix: str, retry_after: int = 2, times: int | None = 1) -> None:
        self._add_fault(_Fault("rate_limit", path_prefix, times, retry_after=retry_after))

    def slow(self, path_prefix: str, seconds: float, times: int | None = 1) -> None:
        """Answers normally, but only after `seconds`: exercises the client's timeout."""
        self._add_fault(_Fault("slow", path_prefix, times, seconds=seconds))

    def _add_fault(self, fault: _Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    @property
    def requests(self) -> list[tuple[str, str]]:
        """The (method, path) of each /v1 request, oldest first (the last 100,000); a copy."""
        with self._lock:
            return list(self._requests)

    def reset(self) -> None:
        with self._lock:
            for objects in self._objects.values():
                objects.clear()
            self._faults.clear()
            self._requests.clear()

    def apply_state(self, body: dict[str, Any]) -> dict[str, Any]:
        """The ``/_stub/state`` command: a raw ``object``, or a ``kind`` with ``args`` for its put_ method."""
        if "object" in body:
            return self.put(body["object"])
        method = getattr(self, "put_" + _kind(body["kind"]).removeprefix("radar.").replace(".", "_"))
        result: dict[str, Any] = method(**body.get("args", {}))
        return result

    # serving ----------------------------------------------------------------
    def _take_fault(self, path: str) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if path.startswith(fault.path_prefix):
                    if fault.times is not None:
                        fault.times -= 1
                        if fault.times <= 0:
                            self._faults.remove(fault)
                    return fault
        return None

    async def _gate(self, request: Request[Any, Any, Any]) -> Response[Any] | None:
        """Runs before every /v1 handler: log, authenticate like Stripe, then apply a scheduled fault."""
        with self._lock:
            self._requests.append((request.method, request.url.path))
        if not request.headers.get("authorization", "").startswith(("Bearer sk_", "Bearer rk_")):
            return _error(401, "You did not provide a valid API key. Use 'Authorization: Bearer sk_...'.")
        fault = self._take_fault(request.url.path)
        if fault is None:
            return None
        if fault.mode == "slow":
            await asyncio.sleep(fault.seconds)
            return None
        if fault.mode == "rate_limit":
            body = {"error": {"type": "invalid_request_error", "code": "rate_limit", "message": _RATE_LIMIT}}
            return _answer(429, body, {"Retry-After": str(fault.retry_after)})
        return _error(fault.status, "An unknown error occurred (stub fault).", "api_error")

    def _retrieve(self, kind: str, object_id: str) -> Response[Any]:
        with self._lock:
            obj = self._objects[kind].get(object_id)
            body = copy.deepcopy(obj) if obj is not None else None
        if body is None:
            return _error(404, f"No such {kind}: '{object_id}'", code="resource_missing", param="id")
        return _answer(200, body)

    def _list_subscriptions(self, customer: str | None, status: str | None, limit: int) -> Response[Any]:
        """Newest first; without ``status`` Stripe leaves canceled ones out, ``all`` keeps them."""
        with self._lock:
            subs = [copy.deepcopy(s) for s in reversed(self._objects["subscription"].values())]
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

    def _retrieve_handler(self, kind: str) -> HTTPRouteHandler:
        async def retrieve(object_id: FromPath[str]) -> Response[Any]:
            return self._retrieve(kind, object_id)

        return get(f"/{_SEGMENTS[kind]}/{{object_id:str}}", name=f"retrieve {kind}")(retrieve)

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

        handlers = [list_subscriptions, *(self._retrieve_handler(kind) for kind in _SEGMENTS)]
        return Router("/v1", route_handlers=handlers, before_request=gate)

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
            *(command(f"/{name}", getattr(self, name)) for name in ("remove", "fail", "rate_limit", "slow", "reset")),
            requests,
        ]
        return Router("/_stub", route_handlers=handlers)

    def _build_app(self) -> Litestar:
        def unknown_route(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
            return _error(404, f"Unrecognized request URL ({request.method}: {request.url.path}).")

        return Litestar(
            route_handlers=[self._api_router(), self._control_router()],
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
