"""What the Stripe stub lists and how fast it lets clients call: both Events APIs, expanded lists, a rate limit.

A mixin of ``StripeStubState`` (its objects and lock): ``put_event`` stores a
snapshot event ``/v1/events`` lists and ``put_thin_event`` a thin one
``/v2/core/events`` lists (events a webhook may never have delivered);
``enforce_rate_limit`` makes every API request past N in any one second answer
429, as Stripe does.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

# Subscriptions a customer's ``subscriptions`` list (expanded) leaves out, as Stripe does.
_ENDED = frozenset({"canceled", "incomplete_expired"})


class StripeStubLists:
    """Needs ``self._lock`` and ``self._objects`` (the state's); every method is thread-safe."""

    _lock: threading.Lock
    _objects: dict[str, dict[str, dict[str, Any]]]

    def _init_lists(self) -> None:
        self._rate_limit: int | None = None
        self._recent: deque[float] = deque()
        self.rate_limited = 0
        """How many requests the enforced rate limit answered with 429 (since the last reset)."""

    # events ------------------------------------------------------------------
    def put_event(self, event: dict[str, Any]) -> dict[str, Any]:
        """An event the Events API lists (``stripe_event(...)`` builds one); its ``created`` orders the list."""
        return self._put_listed("event", event)

    def put_thin_event(self, event: dict[str, Any]) -> dict[str, Any]:
        """A thin event the v2 Events API lists (``stripe_thin_event(...)`` builds one); ``created`` orders the list."""
        return self._put_listed("v2.core.event", event)

    def _list_events(
        self, created_gte: int | None, created_lte: int | None, types: list[str], limit: int, starting_after: str | None
    ) -> dict[str, Any]:
        """Newest first (``created``, then the latest put), as Stripe pages them."""
        events = self._listed("event", lambda event: int(event["created"]), types, created_gte, created_lte)
        events = _after(events, starting_after)
        return {"object": "list", "data": events[:limit], "has_more": len(events) > limit, "url": "/v1/events"}

    def _list_thin_events(
        self, created_gte: str | None, created_lte: str | None, types: list[str], limit: int, page: str | None
    ) -> dict[str, Any]:
        """Newest first, as the v2 Events API pages them: ``next_page_url`` repeats the filters with ``page``, the
        last id listed (``created`` compares as RFC 3339 times of one format do, as text)."""
        events = self._listed("v2.core.event", lambda event: str(event["created"]), types, created_gte, created_lte)
        events = _after(events, page)
        listed, next_page_url = events[:limit], None
        if len(events) > limit:
            query = [*(f"types[{n}]={name}" for n, name in enumerate(types)), f"limit={limit}"]
            query += [f"created[{op}]={value}" for op, value in (("gte", created_gte), ("lte", created_lte)) if value]
            next_page_url = "/v2/core/events?" + "&".join([*query, f"page={listed[-1]['id']}"])
        return {"data": listed, "next_page_url": next_page_url, "previous_page_url": None}

    def _put_listed(self, kind: str, event: dict[str, Any]) -> dict[str, Any]:
        stored = copy.deepcopy(event)
        with self._lock:
            self._objects[kind][str(stored["id"])] = stored
        return copy.deepcopy(stored)

    def _listed(
        self, kind: str, created: Callable[[dict[str, Any]], Any], types: list[str], gte: Any, lte: Any
    ) -> list[dict[str, Any]]:
        """Copies of the events of ``kind`` of ``types`` (all: none given) created in the window, newest first."""
        with self._lock:
            events = [copy.deepcopy(e) for e in reversed(self._objects[kind].values())]
        events.sort(key=created, reverse=True)
        return [
            event
            for event in events
            if (not types or event["type"] in types)
            and (gte is None or created(event) >= gte)
            and (lte is None or created(event) <= lte)
        ]

    def _expanded_customer(self, customer: dict[str, Any]) -> dict[str, Any]:
        """``expand[]=subscriptions``: the customer's subscriptions that have not ended, newest first."""
        with self._lock:
            subs = [copy.deepcopy(s) for s in reversed(self._objects["subscription"].values())]
        current = [s for s in subs if s.get("customer") == customer["id"] and s.get("status") not in _ENDED]
        url = f"/v1/customers/{customer['id']}/subscriptions"
        return {**customer, "subscriptions": {"object": "list", "data": current, "has_more": False, "url": url}}

    def _expanded_charge(self, charge: dict[str, Any]) -> dict[str, Any]:
        """``expand[]=refunds``: the charge's refunds as they are, newest first."""
        with self._lock:
            refunds = [copy.deepcopy(r) for r in reversed(self._objects["refund"].values())]
        mine = [r for r in refunds if r.get("charge") == charge["id"]]
        url = f"/v1/charges/{charge['id']}/refunds"
        return {**charge, "refunds": {"object": "list", "data": mine, "has_more": False, "url": url}}

    # rate limit ----------------------------------------------------------------
    def enforce_rate_limit(self, per_second: int | None) -> None:
        """Every /v1 request beyond ``per_second`` in any one-second window answers 429 (None: no limit)."""
        with self._lock:
            self._rate_limit = per_second
            self._recent.clear()

    def _over_rate_limit(self) -> bool:
        now = time.monotonic()
        with self._lock:
            if self._rate_limit is None:
                return False
            while self._recent and self._recent[0] <= now - 1.0:
                self._recent.popleft()
            if len(self._recent) >= self._rate_limit:
                self.rate_limited += 1
                return True
            self._recent.append(now)
            return False

    def _reset_lists(self) -> None:
        with self._lock:
            self._rate_limit = None
            self._recent.clear()
            self.rate_limited = 0


def _after(events: list[dict[str, Any]], event_id: str | None) -> list[dict[str, Any]]:
    """The events listed after ``event_id`` (all: None; none: an id not listed)."""
    if event_id is None:
        return events
    ids = [event["id"] for event in events]
    return events[ids.index(event_id) + 1 :] if event_id in ids else []
