"""The one place that talks to Stripe: current state, read through the async SDK, as plain values.

Reads go through the SDK's raw requests (its HTTP client, authentication,
parameter encoding and error classes) and are used as the JSON Stripe sent:
building the SDK's objects only to turn them back into dicts cost about half
of a read's CPU. The same holds for what thin events name: the SDK's
``fetch_related_object_async()`` and ``client.v2.core.events.list_async()``
would read outside the budget and build objects, so the related object is read
by its id (:meth:`StripeGateway.customer_of`) and the v2 Events API through
the same raw request path (:meth:`StripeGateway.thin_events_page`, paged by
``next_page_url`` as the SDK's own auto-paging does).

Handlers never trust an event body, so every sync reads Stripe. This file owns
the client (``stripe.HTTPXClient`` binds to the event loop that first uses
it: ``budget.stripe_gateway(resources)`` keeps one per process and closes it
with the process's resources), the timeout of every call, the base URL (a
stub in tests and demos), the calls through the ``stripe`` upstream it is
given (``budget.STRIPE``: every call passes its rate, taking a slot from
the sync's ``Reservation`` when a sync makes it, and its gate: the outage
hold and an operator's pause) and the mapping of Stripe's failures onto the queue's rules:
a 429 pauses the budget for its ``Retry-After``, then a command's call is made
again (a sync comes back after it: it holds its locks meanwhile); a 4xx other
than 408/425/429 is permanent; anything else (5xx, timeouts, refused
connections) is retried with backoff, and counts toward a hold of the
upstream, whose jobs then wait without spending attempts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from app.billing.stripe_objects import (
    Charge,
    CheckoutSession,
    CustomerBilling,
    CustomerOfKind,
    MirroredObject,
    MirrorKind,
    RefundedCharge,
    link_id,
    parse_charge,
    parse_subscription,
    rfc3339,
    timestamp,
)
from app.core.lazy_import import lazy_module
from app.core.metrics import STRIPE_BUDGET_WAIT, STRIPE_REQUESTS, child
from app.core.settings import Settings
from app.queue.errors import RetryLater, error_for_http_status
from app.queue.upstreams import UpstreamCalls
from app.queue.upstreams.rate import MAX_WAIT_SECONDS, Reservation

if TYPE_CHECKING:
    import stripe
else:  # imported with its first use: most processes never call Stripe (app/core/lazy_import.py)
    stripe = lazy_module("stripe")

logger = logging.getLogger(__name__)
# A customer with more subscriptions than this is not a seat-based SaaS customer; the newest ones count.
_SUBSCRIPTION_PAGE = 100
_EVENTS_PAGE = 100
_CURRENT = frozenset({"active", "trialing", "past_due"})
_WRONG_ACCOUNT = " Check that STRIPE_API_KEY belongs to the Stripe account and mode (test/live) of the webhook."
_HINTS = {401: _WRONG_ACCOUNT, 403: _WRONG_ACCOUNT, 404: _WRONG_ACCOUNT}
_DEFAULT_RETRY_AFTER_SECONDS = 1.0
_THIN_EVENTS_PATH = "/v2/core/events"
_CUSTOMER_OF_PATHS: dict[CustomerOfKind, str] = {"subscription": "subscriptions", "invoice": "invoices"}
_MIRROR_PATHS: dict[MirrorKind, str] = {
    "dispute": "disputes",
    "refund": "refunds",
    "early_fraud_warning": "radar/early_fraud_warnings",
}


def _path(collection: str, object_id: str) -> str:
    """``/v1/<collection>/<id>``, the id quoted whole: ids come from event bodies, which are not trusted."""
    return f"/v1/{collection}/{quote(object_id, safe='')}"


def _said(exc: stripe.StripeError) -> str:
    """Stripe's message, without its closing period (ours follows)."""
    return str(exc.user_message or exc).rstrip(". ")


def _retry_after(exc: stripe.StripeError) -> float | None:
    headers = {key.lower(): value for key, value in (exc.headers or {}).items()}
    try:
        return float(headers["retry-after"])
    except (KeyError, ValueError):
        return None


class _RateLimited(RetryLater):
    """Stripe answered 429 (the budget is paused for every process): the call is made again after it."""


class StripeGateway:
    """Reads of the Stripe API, each bounded by ``STRIPE_API_TIMEOUT_SECONDS``, through the ``stripe`` upstream."""

    def __init__(self, settings: Settings, upstream: UpstreamCalls) -> None:
        self.base_url = settings.stripe_api_base
        self.timeout = settings.stripe_api_timeout_seconds
        self.upstream = upstream
        self.budget = upstream.budget
        self._http = stripe.HTTPXClient(timeout=self.timeout)
        # No SDK retries (its default): retries belong to the job layer, with backoff and a durable count.
        self._client = stripe.StripeClient(
            settings.stripe_api_key, base_addresses={"api": self.base_url}, http_client=self._http
        )

    async def close(self) -> None:
        await self._http.close_async()

    async def customer_billing(self, customer_id: str, reservation: Reservation | None = None) -> CustomerBilling:
        """One call when the customer has a current subscription (they come expanded), two when it has none.

        ``reservation``: the sync's reserved slots (else each call takes the first free slot).
        """
        customer = await self._get(
            "customers.retrieve",
            f"customer {customer_id}",
            _path("customers", customer_id),
            reservation=reservation,
            expand=["subscriptions"],
        )
        if customer.get("deleted"):
            return CustomerBilling(customer_id, deleted=True, subscriptions=())
        listed = (customer.get("subscriptions") or {}).get("data") or []
        if not any(sub.get("status") in _CURRENT for sub in listed):
            # No current one: the newest of any state is shown (a cancellation stays visible).
            what = f"subscriptions of customer {customer_id}"
            everything: dict[str, Any] = {"customer": customer_id, "status": "all", "limit": _SUBSCRIPTION_PAGE}
            listed = (
                await self._get("subscriptions.list", what, "/v1/subscriptions", reservation=reservation, **everything)
            )["data"]
        newest_first = sorted(listed, key=lambda sub: sub.get("created") or 0, reverse=True)
        return CustomerBilling(customer_id, False, tuple(parse_subscription(sub) for sub in newest_first))

    async def checkout_session(self, session_id: str, reservation: Reservation | None = None) -> CheckoutSession:
        what, path = f"checkout session {session_id}", _path("checkout/sessions", session_id)
        session = await self._get("checkout.sessions.retrieve", what, path, reservation=reservation)
        return CheckoutSession(
            id=session_id,
            customer_id=link_id(session.get("customer")),
            client_reference_id=session.get("client_reference_id") or None,
        )

    async def refunded_charge(self, charge_id: str, reservation: Reservation | None = None) -> RefundedCharge:
        """The charge, with the refunds it has now as they are (one call: they come expanded)."""
        data = await self._get(
            "charges.retrieve",
            f"charge {charge_id}",
            _path("charges", charge_id),
            reservation=reservation,
            expand=["refunds"],
        )
        charge = parse_charge(data)
        refunds = (data.get("refunds") or {}).get("data", [])
        return RefundedCharge(charge, tuple(self._mirror("refund", refund, charge) for refund in refunds))

    async def mirrored(
        self, kind: MirrorKind, stripe_id: str, reservation: Reservation | None = None
    ) -> MirroredObject:
        """The object, then its charge: the charge says which customer (so which workspace) it concerns."""
        path = _path(_MIRROR_PATHS[kind], stripe_id)
        obj = await self._get(f"{kind}s.retrieve", f"{kind} {stripe_id}", path, reservation=reservation)
        return self._mirror(kind, obj, await self._charge_of(obj, reservation))

    @staticmethod
    def _mirror(kind: MirrorKind, obj: dict[str, Any], charge: Charge | None) -> MirroredObject:
        if kind == "early_fraud_warning":  # a warning has no status or amount of its own: its charge's
            obj = {
                **obj,
                "status": "actionable" if obj.get("actionable") else "not_actionable",
                "reason": obj.get("fraud_type"),
                "amount": charge.amount if charge else None,
                "currency": charge.currency if charge else None,
            }
        return MirroredObject(
            kind=kind,
            stripe_id=str(obj["id"]),
            status=obj.get("status"),
            amount=obj.get("amount"),
            currency=obj.get("currency"),
            reason=obj.get("reason"),
            created_at=timestamp(obj.get("created")),
            customer_id=link_id(obj.get("customer")) or (charge.customer_id if charge else None),
            charge=charge,
        )

    async def events_page(
        self, types: Sequence[str], created_gte: int, created_lte: int, starting_after: str | None
    ) -> tuple[list[dict[str, Any]], bool]:
        """One page of events (newest first) of ``types`` created in the window; and whether more follow."""
        params: dict[str, Any] = {
            "types": list(types),
            "created": {"gte": created_gte, "lte": created_lte},
            "limit": _EVENTS_PAGE,
            **({"starting_after": starting_after} if starting_after else {}),
        }
        page = await self._get("events.list", "the event list", "/v1/events", **params)
        return list(page["data"]), bool(page.get("has_more"))

    async def health(self) -> None:
        """Whether Stripe answers, whatever the subject: one event listed, outside the upstream's gate (it is the
        gate's check); raises as a read would when Stripe does not answer."""
        try:
            await self._client.raw_request_async("get", "/v1/events", limit=1)
        except stripe.StripeError as exc:
            child(STRIPE_REQUESTS, "events.list", str(exc.http_status or "none")).inc()
            raise self._mapped("the event list", exc) from exc
        child(STRIPE_REQUESTS, "events.list", "200").inc()

    async def thin_events_page(
        self, types: Sequence[str], created_gte: datetime, created_lte: datetime, next_page: str | None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of thin events (``/v2/core/events``, newest first) of ``types`` created in the window, and the
        URL of the next page (None: the last). ``next_page``: the URL the previous page gave."""
        what = "the thin event list"
        if next_page is None:
            window = {"gte": rfc3339(created_gte), "lte": rfc3339(created_lte)}
            params: dict[str, Any] = {"types": list(types), "created": window, "limit": _EVENTS_PAGE}
            page = await self._get("v2.core.events.list", what, _THIN_EVENTS_PATH, **params)
        else:
            page = await self._get("v2.core.events.list", what, next_page)
        following = page.get("next_page_url") or None
        if following is not None and not str(following).startswith(f"{_THIN_EVENTS_PATH}?"):
            raise RuntimeError(f"Stripe's thin event list named a next page outside it ({following!r}); retried.")
        return list(page["data"]), following

    async def customer_of(
        self, kind: CustomerOfKind, object_id: str, reservation: Reservation | None = None
    ) -> str | None:
        """The customer a subscription or an invoice belongs to (one call): all a thin event about it leaves to read.

        Read by its id through the budget, not by the SDK's ``fetch_related_object_async()`` (see the docstring).
        """
        path = _path(_CUSTOMER_OF_PATHS[kind], object_id)
        return link_id(
            (await self._get(f"{kind}s.retrieve", f"{kind} {object_id}", path, reservation=reservation)).get("customer")
        )

    async def _charge_of(self, obj: dict[str, Any], reservation: Reservation | None) -> Charge | None:
        charge_id = link_id(obj.get("charge"))
        if charge_id is None:
            return None
        charge = await self._get(
            "charges.retrieve", f"charge {charge_id}", _path("charges", charge_id), reservation=reservation
        )
        return parse_charge(charge)

    async def _get(
        self, operation: str, what: str, path: str, *, reservation: Reservation | None = None, **params: Any
    ) -> dict[str, Any]:
        """One GET through the ``stripe`` upstream, as the JSON Stripe sent.

        ``operation`` names the endpoint in the metrics (a fixed set); ``what`` names the object in messages,
        and is the call's subject for the outage hold; ``reservation``: the calling sync's reserved slots. A 429
        pauses the budget; a sync's call is then retried by its job after the pause (``RetryLater``), a
        command's is waited out and made again. Stripe held or paused: ``UpstreamWait`` (the job comes back).
        """
        started = time.monotonic()
        while True:
            try:
                async with self.upstream.call(what, reservation=reservation) as call:
                    STRIPE_BUDGET_WAIT.observe(call.waited)
                    return await self._request(operation, what, path, params)
            except _RateLimited as limited:
                if reservation is not None or time.monotonic() - started + limited.after_seconds > MAX_WAIT_SECONDS:
                    raise RetryLater(str(limited), after_seconds=limited.after_seconds) from limited
                logger.warning(
                    "Stripe answered 429 reading %s: every process waits %.1f s, then it is read again.",
                    what,
                    limited.after_seconds,
                )

    async def _request(self, operation: str, what: str, path: str, params: dict[str, Any]) -> dict[str, Any]:
        try:
            response = await self._client.raw_request_async("get", path, **params)
        except stripe.StripeError as exc:
            child(STRIPE_REQUESTS, operation, str(exc.http_status or "none")).inc()
            if not isinstance(exc, stripe.RateLimitError):
                raise self._mapped(what, exc) from exc
            wait = _retry_after(exc) or _DEFAULT_RETRY_AFTER_SECONDS
            await self.budget.pause(wait)  # every process waits, also when this attempt gives up
            raise _RateLimited(f"Stripe answered 429 reading {what}", after_seconds=wait) from exc
        child(STRIPE_REQUESTS, operation, "200").inc()
        data: dict[str, Any] = response.data
        return data

    def _mapped(self, what: str, exc: stripe.StripeError) -> Exception:
        if isinstance(exc, stripe.APIConnectionError):
            return ConnectionError(
                f"Stripe did not answer reading {what} within {self.timeout:g}s, or the connection to "
                f"{self.base_url} failed ({exc.user_message or type(exc).__name__}); retried with backoff."
            )
        return self._failure(what, exc)

    @staticmethod
    def _failure(what: str, exc: stripe.StripeError) -> Exception:
        if exc.http_status is None:
            return RuntimeError(f"Stripe failed reading {what}: {_said(exc)}; retried.")
        hint = _HINTS.get(exc.http_status, "")
        return error_for_http_status(
            exc.http_status,
            f"Stripe answered reading {what}: {_said(exc)}.{hint}",
            retry_after=_retry_after(exc),
        )
