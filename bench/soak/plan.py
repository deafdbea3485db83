"""What the soak sends, decided up front from a seed, with the end state each entity must reach.

A *bundle* is one tenant's life: a Clerk organization (created, renamed, sometimes
deleted), its members' users and memberships (each a history of versions), and
for most bundles a Stripe customer that checks out and then moves through
subscription states (the stub's state moves before each event). Beside the
bundles: disputes, refunds and fraud warnings whose status moves; events of
customers linked to no workspace; event types nobody handles (200, not stored);
and the *doomed* events, whose Stripe reads fail forever: they must end set
aside with exactly one alert each.

Clerk histories are sent in order, newest first, or shuffled, so the newest
version must win whatever the arrival order (a deleted entity holds the newest
version that arrived before its deletion: none is written after it). About a
fifth of all events are delivered 2 to 5 times, half of those concurrently.
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from app.testing.deliveries import clerk_event, random_id
from bench.soak.config import SoakConfig

Order = Literal["in order", "newest first", "shuffled"]
MirrorKind = Literal["dispute", "refund", "early_fraud_warning"]
SUB_STATES: list[tuple[str, int, bool]] = [  # (status, seats, cancel at period end) a subscription moves through
    ("trialing", 2, False),
    ("active", 4, False),
    ("active", 5, False),
    ("active", 1, False),
    ("active", 3, True),
    ("past_due", 3, False),
    ("active", 6, False),
    ("canceled", 6, False),
    ("unpaid", 2, False),
]
CURRENT = frozenset({"active", "trialing", "past_due"})


@dataclass(eq=False)
class Event:
    """One distinct event (one inbox row, unless its type is ignored) and its deliveries."""

    provider: Literal["stripe", "clerk"]
    event_id: str
    type: str
    copies: int = 1
    concurrent: bool = False
    payload: dict[str, Any] | None = None  # Clerk: built here; Stripe: when sent, from the stub's state then
    doomed: bool = False
    ignored: bool = False
    # filled while the run goes
    sends: int = 0  # deliveries started (planned copies, plus the noisy IP's)
    accepted: bool = False
    rejected: int | None = None  # a 4xx other than 429: the soak or the product is wrong
    dropped: bool = False  # lost to the endpoint outage (``outage.py``): never sent, never redelivered

    @property
    def emitted(self) -> bool:
        """Its time came: sent, or dropped by the outage (then only a backfill or a reconciliation brings it)."""
        return self.sends > 0 or self.dropped


@dataclass(eq=False)
class ClerkEntity:
    """One user, organization or membership: its versions and the events that carry them, in send order."""

    kind: Literal["user", "organization", "organizationMembership"]
    clerk_id: str
    versions: list[dict[str, Any]]  # each: the expected fields and "updated_at" (ms)
    deleted_ms: int | None
    order: Order
    events: list[Event] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)  # seconds before each event

    @property
    def newest(self) -> dict[str, Any]:
        return max(self.versions, key=lambda v: v["updated_at"])


@dataclass(eq=False)
class Membership(ClerkEntity):
    org: ClerkEntity | None = None
    user: ClerkEntity | None = None
    created_ms: int = 0


@dataclass(eq=False)
class StripeStep:
    kind: Literal["change", "invoice"]
    gap: float
    event: Event
    state: tuple[str, int, bool] | None = None
    flaky: str | None = None  # "fail", "rate_limit" or "slow": the customer's reads fail for a while first


@dataclass(eq=False)
class StripeCustomer:
    customer_id: str
    subscription_id: str
    session_id: str
    checkout: Event
    steps: list[StripeStep]
    initial: tuple[str, int, bool]
    # filled while the run goes
    workspace_id: int | None = None
    final_subscription: dict[str, Any] | None = None
    failure: str | None = None


@dataclass(eq=False)
class Bundle:
    start: float
    org: ClerkEntity
    users: list[ClerkEntity]
    memberships: list[Membership]
    stripe: StripeCustomer | None
    stripe_delay: float


@dataclass(eq=False)
class Mirror:
    """A dispute, refund or early fraud warning whose state moves; the mirror row must end as the last one."""

    kind: MirrorKind
    stripe_id: str
    charge_id: str
    start: float
    customer_of: Bundle | None  # the charge's customer, once linked; None: no customer
    states: list[dict[str, Any]]
    events: list[Event]
    gaps: list[float]
    refunded_event: Event | None = None  # refunds: also a charge.refunded naming the charge
    # filled while the run goes
    final: dict[str, Any] | None = None
    charge: dict[str, Any] | None = None
    workspace_id: int | None = None
    failure: str | None = None


@dataclass(eq=False)
class Single:
    """A lone event sent at ``start``: doomed, ignored, or a customer linked to no workspace."""

    start: float
    event: Event
    dispute_id: str | None = None  # doomed: the dispute the stub fails forever


@dataclass
class Plan:
    config: SoakConfig
    bundles: list[Bundle]
    mirrors: list[Mirror]
    singles: list[Single]

    def events(self) -> Iterator[Event]:
        for bundle in self.bundles:
            for entity in [bundle.org, *bundle.users, *bundle.memberships]:
                yield from entity.events
            if bundle.stripe:
                yield bundle.stripe.checkout
                yield from (step.event for step in bundle.stripe.steps)
        for mirror in self.mirrors:
            yield from mirror.events
            if mirror.refunded_event:
                yield mirror.refunded_event
        for single in self.singles:
            yield single.event

    @property
    def planned_deliveries(self) -> int:
        return sum(event.copies for event in self.events())


class Planner:
    def __init__(self, config: SoakConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.base_ms = int(time.time() * 1000) - 86_400_000  # a day ago: Clerk times are the objects' own
        self.users: list[ClerkEntity] = []
        self.membership_seq = 0

    # --- helpers -------------------------------------------------------------------------------------

    def _copies(self, *, doomed: bool = False) -> tuple[int, bool]:
        if self.rng.random() < 0.2:
            return self.rng.randint(2, 5), doomed or self.rng.random() < 0.5
        return 1, False

    def _event(self, provider: Literal["stripe", "clerk"], event_type: str, **extra: Any) -> Event:
        copies, concurrent = self._copies()
        event_id = random_id("evt") if provider == "stripe" else random_id("msg", 27)
        return Event(provider, event_id, event_type, copies=copies, concurrent=concurrent, **extra)

    def _order(self) -> Order:
        roll = self.rng.random()
        return "in order" if roll < 0.4 else "newest first" if roll < 0.7 else "shuffled"

    def _times(self, count: int) -> list[int]:
        start = self.base_ms + self.rng.randint(0, 3_600_000)
        return [start + k * 1000 + self.rng.randint(0, 400) for k in range(count)]

    def _send_order(self, entity: ClerkEntity, items: list[tuple[int, Event]]) -> None:
        """``items`` are (time, event) pairs; send them in the entity's order, with short gaps."""
        items = sorted(items, key=lambda item: item[0])
        if entity.order == "newest first":
            items.reverse()
        elif entity.order == "shuffled":
            self.rng.shuffle(items)
        entity.events = [event for _, event in items]
        entity.gaps = [self.rng.uniform(0.05, 1.5) for _ in items]

    # --- Clerk ---------------------------------------------------------------------------------------

    def organization(self, index: int) -> ClerkEntity:
        org_id = random_id("org", 27)
        times = self._times(1 + self.rng.randint(0, 2))
        versions: list[dict[str, Any]] = [
            {"name": f"Org {index} v{k}", "slug": f"org-{index}-v{k}", "updated_at": t} for k, t in enumerate(times)
        ]
        deleted = times[-1] + 500 if self.rng.random() < 0.05 else None
        entity = ClerkEntity("organization", org_id, versions, deleted, self._order())
        items: list[tuple[int, Event]] = []
        for k, version in enumerate(versions):
            kind = "organization.created" if k == 0 else "organization.updated"
            data = {"id": org_id, "name": version["name"], "slug": version["slug"], "created_at": times[0]}
            items.append((version["updated_at"], self._clerk(kind, version["updated_at"], data)))
        if deleted is not None:
            items.append((deleted, self._clerk("organization.deleted", deleted, {"id": org_id})))
        self._send_order(entity, items)
        return entity

    def user(self, index: int) -> ClerkEntity:
        user_id = random_id("user", 27)
        times = self._times(1 + self.rng.randint(0, 3))
        versions: list[dict[str, Any]] = [
            {"first_name": f"U{index}", "last_name": f"v{k}", "email": f"u{index}.v{k}@soak.test", "updated_at": t}
            for k, t in enumerate(times)
        ]
        deleted = times[-1] + 500 if self.rng.random() < 0.05 else None
        entity = ClerkEntity("user", user_id, versions, deleted, self._order())
        items: list[tuple[int, Event]] = []
        for k, version in enumerate(versions):
            email_id = f"idn_{index}_{k}"
            data = {
                "id": user_id,
                "first_name": version["first_name"],
                "last_name": version["last_name"],
                "email_addresses": [{"id": email_id, "email_address": version["email"], "object": "email_address"}],
                "primary_email_address_id": email_id,
                "created_at": times[0],
            }
            kind = "user.created" if k == 0 else "user.updated"
            items.append((version["updated_at"], self._clerk(kind, version["updated_at"], data)))
        if deleted is not None:
            items.append((deleted, self._clerk("user.deleted", deleted, {"id": user_id})))
        self._send_order(entity, items)
        return entity

    def membership(self, org: ClerkEntity, user: ClerkEntity) -> Membership:
        self.membership_seq += 1
        created = self.base_ms + self.membership_seq * 10  # distinct: seats go to the oldest members
        first = created + self.rng.randint(1000, 3_600_000)
        times = [first + k * 1000 + self.rng.randint(0, 400) for k in range(1 + self.rng.randint(0, 1))]
        roles = ["org:member", "org:admin"]
        versions: list[dict[str, Any]] = [
            {"role": roles[(k + self.membership_seq) % 2], "updated_at": t} for k, t in enumerate(times)
        ]
        deleted = times[-1] + 500 if self.rng.random() < 0.1 else None
        entity = Membership(
            "organizationMembership",
            random_id("orgmem", 27),
            versions,
            deleted,
            self._order(),
            org=org,
            user=user,
            created_ms=created,
        )
        organization = {
            "id": org.clerk_id,
            "name": org.versions[0]["name"],
            "slug": org.versions[0]["slug"],
            "object": "organization",
            "created_at": org.versions[0]["updated_at"],
        }
        public = {
            "user_id": user.clerk_id,
            "first_name": user.versions[0]["first_name"],
            "last_name": user.versions[0]["last_name"],
            "identifier": user.versions[0]["email"],
        }
        items: list[tuple[int, Event]] = []
        for k, version in enumerate(versions):
            kind = "organizationMembership.created" if k == 0 else "organizationMembership.updated"
            data = {
                "id": entity.clerk_id,
                "role": version["role"],
                "created_at": created,
                "organization": organization,
                "public_user_data": public,
            }
            items.append((version["updated_at"], self._clerk(kind, version["updated_at"], data)))
        if deleted is not None:
            data = {
                "id": entity.clerk_id,
                "role": versions[-1]["role"],
                "created_at": created,
                "organization": organization,
                "public_user_data": public,
            }
            items.append((deleted, self._clerk("organizationMembership.deleted", deleted, data)))
        self._send_order(entity, items)
        return entity

    def _clerk(self, event_type: str, timestamp: int, data: dict[str, Any]) -> Event:
        event = self._event("clerk", event_type)
        payload = clerk_event(event_type, timestamp=timestamp)
        payload["data"].update(copy.deepcopy(data))
        if event_type.endswith((".created", ".updated")):
            payload["data"]["updated_at"] = timestamp
        event.payload = payload
        return event

    # --- Stripe --------------------------------------------------------------------------------------

    def stripe_customer(self) -> StripeCustomer:
        states = list(SUB_STATES)
        initial = states[self.rng.randint(0, 2)]
        steps: list[StripeStep] = []
        for _ in range(self.rng.randint(1, 4)):
            kind = "customer.subscription.updated"
            # Sometimes right after the previous change (a trial ending at checkout), mostly seconds apart.
            gap = self.rng.uniform(0.02, 0.3) if self.rng.random() < 0.25 else self.rng.uniform(0.5, 3.0)
            roll = self.rng.random()
            flaky = "fail" if roll < 0.08 else "rate_limit" if roll < 0.12 else "slow" if roll < 0.15 else None
            steps.append(StripeStep("change", gap, self._event("stripe", kind), self.rng.choice(states), flaky))
        for _ in range(self.rng.randint(0, 2)):
            kind = self.rng.choice(["invoice.paid", "invoice.payment_failed"])
            at = self.rng.randint(0, len(steps))
            steps.insert(at, StripeStep("invoice", self.rng.uniform(0.1, 2.0), self._event("stripe", kind)))
        return StripeCustomer(
            customer_id=random_id("cus", 14),
            subscription_id=random_id("sub"),
            session_id=random_id("cs_test", 40),
            checkout=self._event("stripe", "checkout.session.completed"),
            steps=steps,
            initial=initial,
        )

    def mirror(self, start: float, customer_of: Bundle | None) -> Mirror:
        kinds: list[MirrorKind] = ["dispute", "dispute", "refund", "early_fraud_warning"]
        kind = self.rng.choice(kinds)
        charge_id = random_id("ch")
        states: list[dict[str, Any]]
        if kind == "dispute":
            flow = ["warning_needs_response", "needs_response", "under_review", self.rng.choice(["won", "lost"])]
            states = [{"status": s, "amount": 1000 + 10 * i, "reason": "fraudulent"} for i, s in enumerate(flow)]
            states = states[: self.rng.randint(2, 4)]
            names = (
                ["charge.dispute.created"]
                + ["charge.dispute.updated"] * (len(states) - 2)
                + ["charge.dispute.closed" if states[-1]["status"] in ("won", "lost") else "charge.dispute.updated"]
            )
            stripe_id = random_id("dp")
        elif kind == "refund":
            states = [{"status": "pending", "amount": 500}, {"status": "succeeded", "amount": 500}]
            names = ["refund.created", "refund.updated"]
            stripe_id = random_id("re")
        else:
            states = [{"actionable": True, "fraud_type": "misc"}, {"actionable": False, "fraud_type": "misc"}]
            states = states[: self.rng.randint(1, 2)]
            names = ["radar.early_fraud_warning.created", "radar.early_fraud_warning.updated"][: len(states)]
            stripe_id = random_id("issfr")
        events = [self._event("stripe", name) for name in names]
        gaps = [self.rng.uniform(0.3, 2.5) for _ in events]
        refunded = self._event("stripe", "charge.refunded") if kind == "refund" else None
        return Mirror(kind, stripe_id, charge_id, start, customer_of, states, events, gaps, refunded)

    # --- the plan ------------------------------------------------------------------------------------

    def build(self) -> Plan:
        config = self.config
        span = config.send_seconds
        singles: list[Single] = []
        for _ in range(config.doomed_events):
            copies, concurrent = self._copies(doomed=True)
            event = Event("stripe", random_id("evt"), "charge.dispute.created", copies, concurrent, doomed=True)
            singles.append(Single(self.rng.uniform(0.30, 0.32) * span, event, dispute_id=random_id("dp")))
        for _ in range(max(2, config.events // 400)):
            ignored = self._event("stripe", "customer.created", ignored=True)
            singles.append(Single(self.rng.uniform(0, 0.9 * span), ignored))
            clerk = self._event("clerk", "session.created", ignored=True)
            clerk.payload = {
                "data": {"id": random_id("sess"), "object": "session"},
                "object": "event",
                "timestamp": self.base_ms,
                "type": "session.created",
            }
            singles.append(Single(self.rng.uniform(0, 0.9 * span), clerk))
        for _ in range(max(2, config.events // 200)):
            unlinked = self._event("stripe", "customer.subscription.updated")
            singles.append(Single(self.rng.uniform(0, 0.9 * span), unlinked))
        plan = Plan(config, [], [], singles)
        planned = sum(single.event.copies for single in singles)
        index = 0
        while planned < config.events:
            index += 1
            bundle = self.bundle(index, self.rng.uniform(0, 0.8 * span))
            plan.bundles.append(bundle)
            planned += sum(e.copies for e in self._bundle_events(bundle))
            for _ in range(3):
                if self.rng.random() < 0.12:
                    linked = bundle if bundle.stripe and self.rng.random() < 0.5 else None
                    mirror = self.mirror(bundle.start + self.rng.uniform(1, 8), linked)
                    plan.mirrors.append(mirror)
                    planned += sum(e.copies for e in mirror.events) + (
                        mirror.refunded_event.copies if mirror.refunded_event else 0
                    )
        return plan

    def bundle(self, index: int, start: float) -> Bundle:
        org = self.organization(index)
        users, memberships = [], []
        for _ in range(self.rng.randint(1, 5)):
            if self.users and self.rng.random() < 0.15:
                user = self.rng.choice(self.users)  # someone in two workspaces
            else:
                user = self.user(len(self.users) + 1)
                self.users.append(user)
                users.append(user)
            memberships.append(self.membership(org, user))
        stripe = self.stripe_customer() if self.rng.random() < 0.6 else None
        return Bundle(start, org, users, memberships, stripe, self.rng.uniform(1.0, 4.0))

    @staticmethod
    def _bundle_events(bundle: Bundle) -> Iterator[Event]:
        for entity in [bundle.org, *bundle.users, *bundle.memberships]:
            yield from entity.events
        if bundle.stripe:
            yield bundle.stripe.checkout
            yield from (step.event for step in bundle.stripe.steps)


def build_plan(config: SoakConfig) -> Plan:
    return Planner(config).build()


def expected_billing(subscription: dict[str, Any] | None, free_limit: int) -> dict[str, Any]:
    """The workspace's billing columns for the one subscription its customer has (the stub's last state)."""
    if subscription is None:
        return {
            "subscription_id": None,
            "subscription_status": None,
            "seat_quantity": None,
            "cancel_at_period_end": False,
            "member_limit": free_limit,
        }
    seats = subscription["items"]["data"][0]["quantity"]
    status = subscription["status"]
    return {
        "subscription_id": subscription["id"],
        "subscription_status": status,
        "seat_quantity": seats,
        "cancel_at_period_end": bool(subscription["cancel_at_period_end"]),
        "member_limit": seats if status in CURRENT else free_limit,
    }
