"""What the Stripe API stub serves: the objects tests put in, the faults they schedule, the request log.

No HTTP here; ``stripe_stub.StripeStub`` serves this state. Objects have the
fixtures' shapes (``deliveries.stripe_object``) with the ids and state a test
puts in; faults (5xx, 429, slowness) are scheduled per path prefix.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from app.testing.deliveries import stripe_object, stripe_subscription
from app.testing.stripe_stub_lists import StripeStubLists
from app.testing.thin_deliveries import RELATED_PATHS

__all__ = ["SEGMENTS", "THIN_EVENTS", "StripeStubState"]

# Stored kind (the object's "object" field) -> its URL segment under /v1 (thin events: /v2/core/events).
SEGMENTS: dict[str, str] = {**RELATED_PATHS, "event": "events"}
THIN_EVENTS = "v2.core.event"
_ALIASES = {"checkout_session": "checkout.session", "early_fraud_warning": "radar.early_fraud_warning"}
_REQUEST_LOG_SIZE = 100_000  # bounded so a long soak run cannot grow it without end


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
    if kind not in SEGMENTS:
        raise KeyError(f"Unknown Stripe stub kind {name!r}; use one of {sorted(SEGMENTS)}")
    return kind


class StripeStubState(StripeStubLists):
    """The stub's objects, fault schedule and request log.

    Every method is thread-safe: tests call them while the server thread answers.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in (*SEGMENTS, THIN_EVENTS)}
        self._faults: list[_Fault] = []
        self._requests: deque[tuple[str, str]] = deque(maxlen=_REQUEST_LOG_SIZE)
        self._request_times: deque[float] = deque(maxlen=_REQUEST_LOG_SIZE)
        self._init_lists()

    # state -------------------------------------------------------------
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

    def put_subscription(self, customer_id: str, **fields: Any) -> dict[str, Any]:
        """One seat-priced item; ``fields`` as ``deliveries.stripe_subscription`` takes them (id, quantity, ...)."""
        return self.put(stripe_subscription(customer_id, **fields))

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

    def put_invoice(self, id: str, *, customer: str, **fields: Any) -> dict[str, Any]:
        """An invoice of ``customer`` (what a thin ``v1.invoice.paid`` names)."""
        return self.put(stripe_object("invoice", id=id, customer=customer, **fields))

    def put_early_fraud_warning(self, id: str, **fields: Any) -> dict[str, Any]:
        return self.put(stripe_object("radar.early_fraud_warning", id=id, **fields))

    def remove(self, kind: str, id: str) -> None:
        """Forgets an object: the API then answers 404 ``resource_missing`` for it."""
        with self._lock:
            self._objects[_kind(kind)].pop(id, None)

    def apply_state(self, body: dict[str, Any]) -> dict[str, Any]:
        """The ``/_stub/state`` command: a raw ``object``, or a ``kind`` with ``args`` for its put_ method."""
        if "object" in body:
            return self.put(body["object"])
        method = getattr(self, "put_" + _kind(body["kind"]).removeprefix("radar.").replace(".", "_"))
        result: dict[str, Any] = method(**body.get("args", {}))
        return result

    # faults ------------------------------------------------------------
    def fail(self, path_prefix: str, status: int = 500, times: int | None = 1) -> None:
        """The next `times` requests under `path_prefix` answer `status` (None: until reset)."""
        self._add_fault(_Fault("fail", path_prefix, times, status=status))

    def rate_limit(self, path_prefix: str, retry_after: int = 2, times: int | None = 1) -> None:
        self._add_fault(_Fault("rate_limit", path_prefix, times, retry_after=retry_after))

    def slow(self, path_prefix: str, seconds: float, times: int | None = 1) -> None:
        """Answers normally, but only after `seconds`: exercises the client's timeout."""
        self._add_fault(_Fault("slow", path_prefix, times, seconds=seconds))

    def clear_faults(self) -> None:
        """Every scheduled fault gone (an outage ends); objects and the request log stay."""
        with self._lock:
            self._faults.clear()

    def _add_fault(self, fault: _Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def _take_fault(self, path: str) -> _Fault | None:
        """The first fault scheduled for `path`, counted as used once."""
        with self._lock:
            for fault in self._faults:
                if path.startswith(fault.path_prefix):
                    if fault.times is not None:
                        fault.times -= 1
                        if fault.times <= 0:
                            self._faults.remove(fault)
                    return fault
        return None

    # request log and reset ---------------------------------------------
    @property
    def request_times(self) -> list[float]:
        """When each API request arrived (``time.monotonic()``), in the order of ``requests``; a copy."""
        with self._lock:
            return list(self._request_times)

    @property
    def requests(self) -> list[tuple[str, str]]:
        """The (method, path) of each API request (/v1, /v2), oldest first (the last 100,000); a copy."""
        with self._lock:
            return list(self._requests)

    def reset(self) -> None:
        with self._lock:
            for objects in self._objects.values():
                objects.clear()
            self._faults.clear()
            self._requests.clear()
            self._request_times.clear()
        self._reset_lists()

    # reads for the server ----------------------------------------------
    def _log_request(self, method: str, path: str) -> None:
        with self._lock:
            self._requests.append((method, path))
            self._request_times.append(time.monotonic())

    def _find(self, kind: str, object_id: str) -> dict[str, Any] | None:
        """A copy of the stored object, or None."""
        with self._lock:
            obj = self._objects[kind].get(object_id)
            return copy.deepcopy(obj) if obj is not None else None

    def _newest_first(self, kind: str) -> list[dict[str, Any]]:
        """Copies of every stored object of `kind`, the latest put first."""
        with self._lock:
            return [copy.deepcopy(obj) for obj in reversed(self._objects[kind].values())]
