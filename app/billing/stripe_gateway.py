"""The one place billing talks to Stripe: current state, read through the async SDK, as plain values.

Handlers never trust an event body, so every sync reads Stripe. This file owns
the client (one per process: ``stripe.HTTPXClient`` binds to the event loop
that first uses it, and is closed with the process's resources), the timeout
of every call, the base URL (a stub in tests and demos) and the mapping of
Stripe's failures onto the queue's rules: a 4xx other than 408/425/429 is
permanent, a 429 waits its ``Retry-After``, anything else (5xx, timeouts,
refused connections) is retried with backoff. The rest of billing sees frozen
dataclasses, never ``StripeObject``s (which are not dicts in stripe 16).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

import stripe

from app.core.resources import Resources
from app.core.settings import Settings
from app.queue.errors import error_for_http_status

EXTENSION_KEY = "billing.stripe_gateway"
MirrorKind = Literal["dispute", "refund", "early_fraud_warning"]
T = TypeVar("T")
# A customer with more subscriptions than this is not a seat-based SaaS customer; the newest ones count.
_SUBSCRIPTION_PAGE = 100
_WRONG_ACCOUNT = " Check that STRIPE_API_KEY belongs to the Stripe account and mode (test/live) of the webhook."
_HINTS = {401: _WRONG_ACCOUNT, 403: _WRONG_ACCOUNT, 404: _WRONG_ACCOUNT}


@dataclass(frozen=True)
class Subscription:
    id: str
    status: str
    price_id: str | None
    quantity: int | None
    current_period_end: datetime | None
    cancel_at_period_end: bool


@dataclass(frozen=True)
class CustomerBilling:
    """A customer's subscriptions as Stripe has them now, newest first (none once the customer is deleted)."""

    customer_id: str
    deleted: bool
    subscriptions: tuple[Subscription, ...]


@dataclass(frozen=True)
class CheckoutSession:
    id: str
    customer_id: str | None
    client_reference_id: str | None


@dataclass(frozen=True)
class Charge:
    """What billing takes from a charge: its customer, amount and currency, which Stripe does not change.

    A refund moves ``amount_refunded``, not ``amount``; a customer, once set,
    stays (Stripe only lets one be added to a charge that had none, which the
    next event about the charge's objects then sees). So they may be read
    before the locks that order syncs and used after them.
    """

    id: str
    customer_id: str | None
    amount: int | None
    currency: str | None


@dataclass(frozen=True)
class RefundedCharge:
    """A charge and the ids of its refunds, as Stripe lists them now."""

    charge: Charge
    refund_ids: tuple[str, ...]


@dataclass(frozen=True)
class MirroredObject:
    """A dispute, refund or early fraud warning as read, with the customer its charge belongs to."""

    kind: MirrorKind
    stripe_id: str
    status: str | None
    amount: int | None
    currency: str | None
    reason: str | None
    created_at: datetime | None
    customer_id: str | None
    charge: Charge | None


def _timestamp(value: Any) -> datetime | None:
    return datetime.fromtimestamp(int(value), UTC) if value is not None else None


def _id(value: Any) -> str | None:
    """A link is an id, or the object itself when expanded."""
    if isinstance(value, Mapping):
        return str(value["id"])
    return str(value) if value else None


def _charge(data: Mapping[str, Any]) -> Charge:
    return Charge(str(data["id"]), _id(data.get("customer")), data.get("amount"), data.get("currency"))


def _subscription(data: Mapping[str, Any]) -> Subscription:
    """The seat item is the subscription's first item; ``current_period_end`` moved there in newer API versions."""
    items = data.get("items", {}).get("data") or [{}]
    item = items[0]
    period_end = item.get("current_period_end", data.get("current_period_end"))
    return Subscription(
        id=str(data["id"]),
        status=str(data["status"]),
        price_id=_id(item.get("price")),
        quantity=item.get("quantity"),
        current_period_end=_timestamp(period_end),
        cancel_at_period_end=bool(data.get("cancel_at_period_end")),
    )


def _retry_after(exc: stripe.StripeError) -> float | None:
    headers = {key.lower(): value for key, value in (exc.headers or {}).items()}
    try:
        return float(headers["retry-after"])
    except (KeyError, ValueError):
        return None


class StripeGateway:
    """Reads of the Stripe API billing needs, each bounded by ``STRIPE_API_TIMEOUT_SECONDS``."""

    def __init__(self, settings: Settings) -> None:
        self.base_url = settings.stripe_api_base
        self.timeout = settings.stripe_api_timeout_seconds
        self._http = stripe.HTTPXClient(timeout=self.timeout)
        # No SDK retries (its default): retries belong to the job layer, with backoff and a durable count.
        self._client = stripe.StripeClient(
            settings.stripe_api_key, base_addresses={"api": self.base_url}, http_client=self._http
        )

    async def close(self) -> None:
        await self._http.close_async()

    async def customer_billing(self, customer_id: str) -> CustomerBilling:
        customer = await self._call(f"customer {customer_id}", self._client.v1.customers.retrieve_async(customer_id))
        if customer.get("deleted"):
            return CustomerBilling(customer_id, deleted=True, subscriptions=())
        params: Any = {"customer": customer_id, "status": "all", "limit": _SUBSCRIPTION_PAGE}
        listed = await self._call(
            f"subscriptions of customer {customer_id}", self._client.v1.subscriptions.list_async(params)
        )
        subscriptions = tuple(_subscription(sub) for sub in listed["data"])
        return CustomerBilling(customer_id, deleted=False, subscriptions=subscriptions)

    async def checkout_session(self, session_id: str) -> CheckoutSession:
        session = await self._call(
            f"checkout session {session_id}", self._client.v1.checkout.sessions.retrieve_async(session_id)
        )
        return CheckoutSession(
            id=session_id,
            customer_id=_id(session.get("customer")),
            client_reference_id=session.get("client_reference_id") or None,
        )

    async def refunded_charge(self, charge_id: str) -> RefundedCharge:
        """The charge, with the refunds it has now (one call: they are expanded)."""
        params: Any = {"expand": ["refunds"]}
        data = await self._call(f"charge {charge_id}", self._client.v1.charges.retrieve_async(charge_id, params))
        refund_ids = tuple(str(refund["id"]) for refund in (data.get("refunds") or {}).get("data", []))
        return RefundedCharge(_charge(data), refund_ids)

    async def mirrored(self, kind: MirrorKind, stripe_id: str, known_charge: Charge | None = None) -> MirroredObject:
        """The object, then its charge: the charge says which customer (so which workspace) it concerns.

        ``known_charge``: the object's charge as read before; what billing takes
        from it never changes (see ``Charge``), so it is not read again.
        """
        obj = await self._call(f"{kind} {stripe_id}", self._retrieve(kind, stripe_id))
        charge = await self._charge_of(obj, known_charge)
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
            stripe_id=stripe_id,
            status=obj.get("status"),
            amount=obj.get("amount"),
            currency=obj.get("currency"),
            reason=obj.get("reason"),
            created_at=_timestamp(obj.get("created")),
            customer_id=_id(obj.get("customer")) or (charge.customer_id if charge else None),
            charge=charge,
        )

    async def _charge_of(self, obj: Mapping[str, Any], known: Charge | None) -> Charge | None:
        charge_id = _id(obj.get("charge"))
        if charge_id is None:
            return None
        if known is not None and known.id == charge_id:
            return known
        return _charge(await self._call(f"charge {charge_id}", self._client.v1.charges.retrieve_async(charge_id)))

    def _retrieve(self, kind: MirrorKind, stripe_id: str) -> Awaitable[Any]:
        v1 = self._client.v1
        if kind == "dispute":
            return v1.disputes.retrieve_async(stripe_id)
        if kind == "refund":
            return v1.refunds.retrieve_async(stripe_id)
        return v1.radar.early_fraud_warnings.retrieve_async(stripe_id)

    async def _call(self, what: str, call: Awaitable[Any]) -> dict[str, Any]:
        """Await one SDK call and return the object as a plain dict, or raise what the queue understands."""
        try:
            result = await call
        except stripe.APIConnectionError as exc:
            raise ConnectionError(
                f"Stripe did not answer reading {what} within {self.timeout:g}s, or the connection to "
                f"{self.base_url} failed ({exc.user_message or type(exc).__name__}); retried with backoff."
            ) from exc
        except stripe.StripeError as exc:
            if exc.http_status is None:
                raise RuntimeError(f"Stripe failed reading {what}: {exc.user_message or exc}; retried.") from exc
            hint = _HINTS.get(exc.http_status, "")
            raise error_for_http_status(
                exc.http_status,
                f"Stripe answered reading {what}: {exc.user_message or exc}.{hint}",
                retry_after=_retry_after(exc),
            ) from exc
        data: dict[str, Any] = result.to_dict()
        return data


def stripe_gateway(resources: Resources) -> StripeGateway:
    """The process's gateway, built on first use and closed with the resources (one HTTP client per process)."""
    gateway = resources.extensions.get(EXTENSION_KEY)
    if gateway is None:
        if not resources.settings.stripe_api_key:
            # Retried, not permanent: once the key is deployed the waiting events heal by themselves.
            raise RuntimeError("Cannot read billing state from Stripe: STRIPE_API_KEY is not set. Set it.")
        gateway = StripeGateway(resources.settings)
        resources.extensions[EXTENSION_KEY] = gateway
        resources.add_closer(gateway.close)
    assert isinstance(gateway, StripeGateway)
    return gateway
