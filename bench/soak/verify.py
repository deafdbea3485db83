"""After the load: wait (bounded) for the pipeline to drain, then check it against what was sent."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis

from app.identity.jobs import IDENTITY_QUEUE
from app.queue.queues import QueueName
from bench.soak.clerk_state import ClerkControl
from bench.soak.cluster import REDIS_NAMESPACE, Cluster
from bench.soak.config import SoakConfig
from bench.soak.findings import Findings, read_alerts
from bench.soak.load import NOISY_IP, Sender, max_admitted_in_window
from bench.soak.plan import Plan, expected_billing
from bench.soak.runtime import Db
from bench.soak.verify_clerk import ClerkCheck, clerk_rows

# Every queue the soak's jobs use but the crons': each provider's events, the Stripe syncs (some waiting for their
# turn or their retry), the member limits billing asks identity to apply; not the crons' (a tick is due every minute).
DRAINED_QUEUES = tuple(
    str(queue)
    for queue in (
        QueueName.WEBHOOK,
        QueueName.WEBHOOK_STRIPE,
        QueueName.WEBHOOK_CLERK,
        QueueName.STRIPE_SYNC,
        IDENTITY_QUEUE,
    )
)


class Verifier:
    def __init__(
        self, config: SoakConfig, plan: Plan, sender: Sender, cluster: Cluster, db: Db, clerk: ClerkControl
    ) -> None:
        self.config = config
        self.plan = plan
        self.sender = sender
        self.cluster = cluster
        self.db = db
        self.clerk = clerk
        self.findings = Findings()
        self.clerk_before: dict[str, Any] | None = None  # the Clerk rows before reconciliation
        sent = [event for event in plan.events() if event.emitted]  # the dropped too: a backfill brings them
        self.events = {(e.provider, e.event_id): e for e in sent if not e.ignored}
        self.ignored = {(e.provider, e.event_id): e for e in sent if e.ignored}
        self.doomed = {key for key, e in self.events.items() if e.doomed}

    async def drain(self, within: float, when_idle: Callable[[], Awaitable[None]] | None = None) -> float | None:
        """Seconds until nothing is pending, the doomed are set aside with their alerts and the queues are
        empty; None if that did not happen within ``within`` s. ``when_idle``: called while no job is queued
        but some event is neither processed nor set aside (``recovery.py``)."""
        started = time.monotonic()
        redis = Redis.from_url(self.cluster.redis_url, socket_timeout=2, socket_connect_timeout=2)
        doomed_ids = [event_id for _, event_id in self.doomed]
        last_report = 0.0
        try:
            while time.monotonic() - started < within:
                pending = await self.db.fetchval(
                    "SELECT count(*) FROM webhook_event WHERE processed_at IS NULL AND abandoned_at IS NULL"
                )
                aside = await self.db.fetchval(
                    "SELECT count(*) FROM webhook_event WHERE abandoned_at IS NOT NULL AND event_id = ANY($1)",
                    doomed_ids,
                )
                alerts = read_alerts(self.cluster.sentry_file)
                alerted = sum(1 for event_id in doomed_ids if alerts[event_id] >= 1)
                try:
                    queued = [job for q in DRAINED_QUEUES for job in await redis.zrange(REDIS_NAMESPACE + q, 0, 4)]
                    waiting = sum([await redis.zcard(REDIS_NAMESPACE + queue) for queue in DRAINED_QUEUES])
                except OSError:
                    queued, waiting = [], -1
                if pending == 0 and aside == len(doomed_ids) and alerted == len(doomed_ids) and waiting == 0:
                    return time.monotonic() - started
                if waiting == 0 and (pending or aside < len(doomed_ids)) and when_idle is not None:
                    await when_idle()
                if time.monotonic() - last_report > 10:
                    last_report = time.monotonic()
                    jobs = f" ({', '.join(job.decode() for job in queued)})" if queued and not pending else ""
                    print(
                        f"soak: draining: {pending} pending, {aside}/{len(doomed_ids)} doomed set aside, "
                        f"{alerted} alerted, {waiting} jobs queued{jobs}",
                        flush=True,
                    )
                await asyncio.sleep(1.0)
        finally:
            await redis.aclose()
        return None

    async def snapshot_clerk(self) -> None:
        """The Clerk rows as the webhooks alone left them: ``check`` holds the untouched entities to them."""
        self.clerk_before = await clerk_rows(self.db)

    async def check(self, drain_seconds: float | None) -> Findings:
        f = self.findings
        f.drain_seconds = drain_seconds
        f.sent = sum(e.sends for e in self.plan.events())
        f.distinct, f.ignored, f.doomed = len(self.events), len(self.ignored), len(self.doomed)
        dropped = Counter(e.provider for e in self.plan.events() if e.dropped)
        f.dropped_stripe, f.dropped_clerk = dropped["stripe"], dropped["clerk"]
        if drain_seconds is None:
            f.problem(f"the pipeline did not drain within {self.config.drain_timeout_seconds:.0f} s")
        await self._inbox()
        await self._commits()
        self._alerts()
        self._intake()
        await self._clerk()
        await self._workspaces()
        await self._seats()
        await self._mirrors()
        self._rate_limit()
        return f

    # --- the inbox and the handler commits -----------------------------------------------------------

    async def _inbox(self) -> None:
        f = self.findings
        rows = await self.db.fetch(
            "SELECT provider, event_id, processed_at IS NOT NULL AS processed, abandoned_at IS NOT NULL AS aside, "
            "attempts, last_error FROM webhook_event"
        )
        f.stored = len(rows)
        by_key = Counter((r["provider"], r["event_id"]) for r in rows)
        if doubled := [key for key, n in by_key.items() if n > 1]:
            f.problem(f"{len(doubled)} events have more than one inbox row", doubled)
        if stored_ignored := [key for key in by_key if key in self.ignored]:
            f.problem(f"{len(stored_ignored)} events of unhandled types were stored", stored_ignored)
        if unknown := [key for key in by_key if key not in self.events and key not in self.ignored]:
            f.problem(f"{len(unknown)} inbox rows for events never sent", unknown)
        state = {(r["provider"], r["event_id"]): r for r in rows}
        f.processed = sum(1 for r in rows if r["processed"])
        f.set_aside = sum(1 for r in rows if r["aside"])
        missing = [key for key, e in self.events.items() if e.accepted and key not in state]
        unbackfilled = [
            key for key, e in self.events.items() if e.dropped and e.provider == "stripe" and key not in state
        ]
        stuck = [
            (key, state[key]["attempts"], state[key]["last_error"])
            for key in self.events
            if key in state and not state[key]["processed"] and not state[key]["aside"]
        ]
        wrongly = [
            (key, state[key]["attempts"], state[key]["last_error"])
            for key in self.events
            if key in state and state[key]["aside"] and key not in self.doomed
        ]
        doomed_done = [key for key in self.doomed if key in state and state[key]["processed"]]
        f.missing, f.stuck, f.wrongly_set_aside = len(missing), len(stuck), len(wrongly)
        f.undelivered = len({(e.provider, e.event_id) for e in self.sender.stats.undelivered if not e.accepted})
        f.dropped_lost += len(unbackfilled)
        if missing:
            f.problem(f"LOST: {len(missing)} accepted events have no inbox row", missing)
        if unbackfilled:
            f.problem(f"LOST: {len(unbackfilled)} dropped Stripe events were not backfilled", unbackfilled)
        if stuck:
            f.problem(f"LOST: {len(stuck)} events neither processed nor set aside", stuck)
        if f.undelivered:
            f.problem(f"LOST: {f.undelivered} events never accepted within the re-send deadline")
        if wrongly:
            f.problem(f"{len(wrongly)} events set aside that were not meant to fail", wrongly)
        if doomed_done:
            f.problem(f"{len(doomed_done)} doomed events were processed (their Stripe reads always fail)", doomed_done)
        if rejected := [(e.event_id, e.rejected) for e in self.events.values() if e.rejected]:
            f.problem(f"{len(rejected)} deliveries rejected with a 4xx", rejected)

    async def _commits(self) -> None:
        f = self.findings
        twice = await self.db.fetch(
            "SELECT provider, event_id, count(*) AS n FROM soak_handler_commit GROUP BY 1, 2 HAVING count(*) > 1"
        )
        f.applied_twice = len(twice)
        if twice:
            f.problem(
                f"APPLIED TWICE: {len(twice)} events' handlers committed more than once",
                [(r["event_id"], r["n"]) for r in twice],
            )
        lacking = await self.db.fetch(
            "SELECT e.provider, e.event_id FROM webhook_event e WHERE e.processed_at IS NOT NULL AND NOT EXISTS "
            "(SELECT 1 FROM soak_handler_commit c WHERE c.provider = e.provider AND c.event_id = e.event_id)"
        )
        if lacking:
            f.problem(
                f"{len(lacking)} events marked processed without their handler's commit",
                [r["event_id"] for r in lacking],
            )

    def _alerts(self) -> None:
        f = self.findings
        alerts = read_alerts(self.cluster.sentry_file)
        doomed_ids = {event_id for _, event_id in self.doomed}
        f.alerts_ok = sum(1 for event_id in doomed_ids if alerts[event_id] == 1)
        if wrong := [(event_id, alerts[event_id]) for event_id in doomed_ids if alerts[event_id] != 1]:
            f.problem(f"{len(wrong)} set-aside events without exactly one alert", wrong)
        if extra := [event_id for event_id in alerts if event_id not in doomed_ids]:
            f.problem(f"{len(extra)} alerts for events not meant to fail", extra)

    def _intake(self) -> None:
        stats = self.sender.stats
        if unexpected := {k: n for k, n in stats.answers.items() if k not in ("200", "429", "503")}:
            # Refused or reset connections and timeouts are re-sent, so they lose nothing; shown in the table.
            print(f"soak: note: intake answers besides 200/429/503: {unexpected}", flush=True)

    # --- end state -----------------------------------------------------------------------------------

    async def _clerk(self) -> None:
        clerk = ClerkCheck(self.plan, self.clerk, self.findings)
        if self.clerk_before is not None:
            clerk.webhooks_alone(self.clerk_before)
        clerk.reconciled(await clerk_rows(self.db))

    async def _workspaces(self) -> None:
        rows = await self.db.fetch(
            "SELECT id, clerk_org_id, stripe_customer_id, subscription_id, subscription_status, seat_quantity, "
            "cancel_at_period_end, member_limit FROM workspace"
        )
        got = {r["clerk_org_id"]: dict(r) for r in rows}
        free = self.config.free_plan_member_limit
        for bundle in self.plan.bundles:
            if not all(event.emitted for event in bundle.org.events):
                continue
            stripe = bundle.stripe
            if stripe is not None and stripe.failure:
                self.findings.problem(f"scenario of customer {stripe.customer_id} failed: {stripe.failure}")
                continue
            linked = stripe is not None and stripe.final_subscription is not None
            want = expected_billing(stripe.final_subscription if stripe and linked else None, free)
            want["stripe_customer_id"] = stripe.customer_id if stripe and linked else None
            self.findings.workspaces_checked += 1
            row = got.get(bundle.org.clerk_id)
            if row is None or {k: row[k] for k in want} != want:
                self.findings.mismatch("workspace", bundle.org.clerk_id, row or {}, want)

    async def _seats(self) -> None:
        """Active members in join order: the first ``member_limit`` hold a seat, the rest are suspended."""
        rows = await self.db.fetch(
            "SELECT w.clerk_org_id, w.member_limit, m.clerk_membership_id, m.suspended_at IS NOT NULL AS suspended "
            "FROM workspace w JOIN workspace_member m ON m.workspace_id = w.id WHERE m.deleted_at IS NULL "
            "ORDER BY w.id, m.created_at, m.id"
        )
        position: Counter[str] = Counter()
        wrong: list[tuple[str, str]] = []
        for row in rows:
            org = row["clerk_org_id"]
            should_be_suspended = position[org] >= row["member_limit"]
            position[org] += 1
            if row["suspended"] != should_be_suspended:
                wrong.append((org, row["clerk_membership_id"]))
        f = self.findings
        f.seat_mismatches = len({org for org, _ in wrong})
        if wrong:
            f.problem(f"SEATS: {f.seat_mismatches} workspaces whose suspended members do not match their limit", wrong)

    async def _mirrors(self) -> None:
        got: dict[str, dict[str, Any]] = {}
        for table in ("billing_dispute", "billing_refund", "billing_fraud_warning"):
            for row in await self.db.fetch(
                f"SELECT stripe_id, status, amount, currency, reason, workspace_id FROM {table}"
            ):
                got[row["stripe_id"]] = dict(row)
        for mirror in self.plan.mirrors:
            if mirror.failure:
                self.findings.problem(f"scenario of {mirror.kind} {mirror.stripe_id} failed: {mirror.failure}")
                continue
            if mirror.final is None or not all(e.emitted for e in mirror.events):
                continue
            final, charge = mirror.final, mirror.charge or {}
            if mirror.kind == "early_fraud_warning":
                want = {
                    "status": "actionable" if final["actionable"] else "not_actionable",
                    "reason": final["fraud_type"],
                    "amount": charge.get("amount"),
                    "currency": charge.get("currency"),
                }
            else:
                want = {"status": final["status"], "amount": final["amount"]}
            want["workspace_id"] = mirror.workspace_id
            self.findings.mirrors_checked += 1
            row = got.get(mirror.stripe_id)
            if row is None or {k: row[k] for k in want} != want:
                self.findings.mismatch(mirror.kind, mirror.stripe_id, row or {}, want)

    def _rate_limit(self) -> None:
        f = self.findings
        limit = self.config.rate_limit
        worst = 0
        for (route, ip), admitted in self.sender.stats.admitted.items():
            most = max_admitted_in_window(admitted)
            worst = max(worst, most)
            if ip == NOISY_IP:
                f.noisy_admitted_max = max(f.noisy_admitted_max, most)
            if most > limit:
                f.problem(f"RATE LIMIT: {ip} on {route} got {most} requests admitted within 60 s (limit {limit})")
        f.rate_limit_max = worst
        noisy = self.sender.stats.noisy_answers
        if noisy["429"] == 0:
            f.problem(f"the noisy client never got a 429 ({dict(noisy)}): the limit was not exercised")
