"""The plan played out: scenarios at their times, the Stripe stub's state moving before each event.

``StubControl`` is the only writer of the stub's state and keeps a copy of it,
so a restarted stub comes back with everything Stripe would still have. While
the stub is down (the outage fault holds the lock) scenarios wait to change it.
Every Stripe event is put into the stub's event list before it is sent (Stripe
lists an event from its creation), every Clerk event first updates the Clerk
stub (``clerk_state``), and the endpoint outage (``outage.py``) may drop it.
``Db`` reads the soak's Postgres for the two things a real app would know before
acting: that a workspace exists before its owner checks out, and that a customer
is linked before its charges are disputed.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg
import httpx
from sqlalchemy.engine import make_url

from app.testing.deliveries import random_id, stripe_event, stripe_object, stripe_subscription
from bench.soak.clerk_state import ClerkControl
from bench.soak.cluster import Cluster
from bench.soak.load import Sender
from bench.soak.plan import Bundle, ClerkEntity, Event, Mirror, Plan, Single, StripeCustomer

if TYPE_CHECKING:  # outage.py reports through faults.py, which drives this module
    from bench.soak.outage import EndpointOutage


class StubControl:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.lock = asyncio.Lock()
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.forever: list[dict[str, Any]] = []  # faults with times=None, armed again after a restart
        self.client = httpx.AsyncClient(timeout=10.0)
        self.snapshots = 0

    async def close(self) -> None:
        await self.client.aclose()

    async def _post(self, path: str, body: dict[str, Any]) -> None:
        for attempt in range(100):
            try:
                response = await self.client.post(f"{self.cluster.stripe_url}/_stub/{path}", json=body)
                response.raise_for_status()
                return
            except httpx.TransportError:
                await asyncio.sleep(min(0.1 * (attempt + 1), 1.0))  # between the kill and the lock: wait
        raise RuntimeError(f"the Stripe stub did not take /_stub/{path}")

    async def put(self, obj: dict[str, Any]) -> None:
        async with self.lock:
            self.objects[(obj["object"], obj["id"])] = copy.deepcopy(obj)
            await self._post("state", {"object": obj})

    async def put_event(self, event: dict[str, Any]) -> None:
        """Into the Events API's list (an event is an object of kind ``event``: kept across restarts too)."""
        await self.put(event)

    async def fault(self, mode: str, **arguments: Any) -> None:
        async with self.lock:
            if arguments.get("times", 1) is None:
                self.forever.append({"mode": mode, **arguments})
            await self._post(mode, arguments)

    def snapshot(self, directory: Path) -> Path:
        """The state a restarted stub loads (call with the lock held)."""
        self.snapshots += 1
        path = directory / f"stripe-state-{self.snapshots}.json"
        state = {"objects": list(self.objects.values()), "faults": copy.deepcopy(self.forever)}
        path.write_text(json.dumps(state))
        return path


class Db:
    def __init__(self, database_url: str) -> None:
        self.dsn = make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)
        self.pool: asyncpg.Pool | None = None

    async def open(self) -> None:
        self.pool = await asyncpg.create_pool(self.dsn, min_size=0, max_size=4, command_timeout=30)

    async def close(self) -> None:
        if self.pool is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.pool.close(), 10)

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        """Retried through a Postgres restart (the pool drops dead connections itself)."""
        assert self.pool is not None
        for attempt in range(60):
            try:
                return list(await self.pool.fetch(query, *args))
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
                if attempt == 59:
                    raise
                await asyncio.sleep(0.5)
        raise AssertionError("unreachable")

    async def fetchval(self, query: str, *args: Any) -> Any:
        rows = await self.fetch(query, *args)
        return rows[0][0] if rows else None

    async def wait_for_value(self, query: str, *args: Any, within: float) -> Any:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            value = await self.fetchval(query, *args)
            if value is not None:
                return value
            await asyncio.sleep(0.5)
        return None


# After Postgres is back, each pooled connection of a process fails once (then leaves the pool): the doomed
# events start once the load has drawn those, so that each of their tries counts as an attempt.
POOL_HEAL_SECONDS = 5.0


class Driver:
    """Runs every scenario of the plan at its time; the load loop is the sum of them."""

    def __init__(
        self,
        plan: Plan,
        sender: Sender,
        stubs: tuple[StubControl, ClerkControl],
        outage: EndpointOutage,
        db: Db,
        rng: random.Random,
    ) -> None:
        self.plan = plan
        self.sender = sender
        self.stub, self.clerk = stubs
        self.outage = outage
        self.db = db
        self.rng = rng
        self.origin = time.monotonic()
        self.quiet_windows: list[tuple[float, float]] = []  # run seconds where no flaky fault is armed
        self.postgres_back = asyncio.Event()  # the doomed wait for both: see faults.py
        self.redis_back = asyncio.Event()

    def now(self) -> float:
        return time.monotonic() - self.origin

    async def at(self, offset: float) -> None:
        await asyncio.sleep(max(0.0, self.origin + offset - time.monotonic()))

    async def run(self) -> None:
        scenarios = [self._bundle(b) for b in self.plan.bundles]
        scenarios += [self._mirror(m) for m in self.plan.mirrors]
        scenarios += [self._single(s) for s in self.plan.singles]
        await asyncio.gather(*scenarios)

    # --- Clerk -------------------------------------------------------------------------------------

    async def _history(self, entity: ClerkEntity, start: float) -> None:
        await self.at(start)
        for gap, event in zip(entity.gaps, entity.events, strict=True):
            await asyncio.sleep(gap)
            await self.clerk.record(entity, event)
            self._emit(event)

    def _emit(self, event: Event) -> None:
        """Its deliveries, unless the endpoint outage drops it (then never sent, never redelivered)."""
        if not self.outage.drops(event, self.now()):
            self.sender.emit(event)

    async def _bundle(self, bundle: Bundle) -> None:
        parts = [self._history(bundle.org, bundle.start)]
        parts += [self._history(user, bundle.start + self.rng.uniform(0, 2)) for user in bundle.users]
        parts += [self._history(m, bundle.start + self.rng.uniform(0, 3)) for m in bundle.memberships]
        if bundle.stripe is not None:
            parts.append(self._customer(bundle, bundle.stripe))
        await asyncio.gather(*parts)

    # --- Stripe ------------------------------------------------------------------------------------

    def _flaky_allowed(self) -> bool:
        now = self.now()
        return not any(start <= now <= end for start, end in self.quiet_windows)

    async def _send_stripe(self, event: Event, obj: dict[str, Any]) -> None:
        event.payload = stripe_event(event.type, obj, event_id=event.event_id)
        await self.stub.put_event(event.payload)
        self._emit(event)

    async def _customer(self, bundle: Bundle, plan: StripeCustomer) -> None:
        """Checkout once the workspace exists (the app starts checkouts for its own workspaces), then changes."""
        await self.at(bundle.start + bundle.stripe_delay)
        workspace_id = await self.db.wait_for_value(
            "SELECT id FROM workspace WHERE clerk_org_id = $1", bundle.org.clerk_id, within=120
        )
        if workspace_id is None:
            plan.failure = "its workspace never appeared"
            return
        plan.workspace_id = int(workspace_id)
        customer = plan.customer_id
        await self.stub.put(stripe_object("customer", id=customer))
        status, seats, cancel = plan.initial
        subscription = stripe_subscription(
            customer, id=plan.subscription_id, status=status, quantity=seats, cancel_at_period_end=cancel
        )
        await self.stub.put(subscription)
        session = stripe_object(
            "checkout.session",
            id=plan.session_id,
            mode="subscription",
            status="complete",
            payment_status="paid",
            customer=customer,
            client_reference_id=str(workspace_id),
            subscription=plan.subscription_id,
        )
        await self.stub.put(session)
        await self._send_stripe(plan.checkout, session)
        for step in plan.steps:
            await asyncio.sleep(step.gap)
            if step.kind == "invoice":
                await self._send_stripe(step.event, stripe_object("invoice", customer=customer))
                continue
            assert step.state is not None
            status, seats, cancel = step.state
            subscription = stripe_subscription(
                customer, id=plan.subscription_id, status=status, quantity=seats, cancel_at_period_end=cancel
            )
            await self.stub.put(subscription)
            if step.flaky and self._flaky_allowed():
                await self._arm_flaky(step.flaky, f"/v1/customers/{customer}")
            await self._send_stripe(step.event, subscription)
        plan.final_subscription = subscription

    async def _arm_flaky(self, mode: str, path: str) -> None:
        if mode == "fail":
            await self.stub.fault("fail", path_prefix=path, status=500, times=2)
        elif mode == "rate_limit":
            await self.stub.fault("rate_limit", path_prefix=path, retry_after=1, times=1)
        else:
            await self.stub.fault("slow", path_prefix=path, seconds=1.5, times=1)

    async def _mirror(self, mirror: Mirror) -> None:
        await self.at(mirror.start)
        customer: str | None = None
        if mirror.customer_of is not None and mirror.customer_of.stripe is not None:
            linked = mirror.customer_of.stripe
            workspace_id = await self.db.wait_for_value(
                "SELECT id FROM workspace WHERE stripe_customer_id = $1", linked.customer_id, within=120
            )
            if workspace_id is None:
                mirror.failure = "its customer was never linked"
                return
            customer, mirror.workspace_id = linked.customer_id, int(workspace_id)
        charge = stripe_object("charge", id=mirror.charge_id, customer=customer, amount=2500, currency="usd")
        await self.stub.put(charge)
        mirror.charge = charge
        obj: dict[str, Any] = {}
        for gap, event, state in zip(mirror.gaps, mirror.events, mirror.states, strict=True):
            await asyncio.sleep(gap)
            obj = stripe_object(
                mirror.kind if mirror.kind != "early_fraud_warning" else "radar.early_fraud_warning",
                id=mirror.stripe_id,
                charge=mirror.charge_id,
                created=1_700_000_000,
                **state,
            )
            await self.stub.put(obj)
            await self._send_stripe(event, obj)
        mirror.final = obj
        if mirror.refunded_event is not None:
            await asyncio.sleep(self.rng.uniform(0.2, 1.5))
            charge = {**charge, "refunded": True, "refunds": {"object": "list", "data": [obj], "has_more": False}}
            await self.stub.put(charge)
            await self._send_stripe(mirror.refunded_event, charge)

    async def _single(self, single: Single) -> None:
        await self.at(single.start)
        event = single.event
        if single.dispute_id is not None:  # doomed: Stripe answers 500 for this dispute, forever
            await self.postgres_back.wait()
            await self.redis_back.wait()
            await asyncio.sleep(POOL_HEAL_SECONDS)
            await self.stub.fault("fail", path_prefix=f"/v1/disputes/{single.dispute_id}", status=500, times=None)
            dispute = stripe_object("dispute", id=single.dispute_id, charge=random_id("ch"))
            await self._send_stripe(event, dispute)
        elif event.provider == "stripe":
            if event.ignored:
                await self._send_stripe(event, stripe_object("customer"))
            else:  # a customer linked to no workspace: processed, nothing to sync
                await self._send_stripe(event, stripe_subscription(stripe_object("customer")["id"]))
        else:
            self._emit(event)
