"""Fault: a webhook endpoint down longer than the providers retry (docs/behaviour.md's last row).

During ``outage_from``..``outage_to`` of the sending phase, ``outage_drop_share``
of the events due (Stripe's and Clerk's) are dropped: never sent, never
redelivered, as when a provider gives up on an endpoint. Stripe still lists them
(every Stripe event is put into the stub's event list), Clerk still holds what
changed (``clerk_state``). After the sending phase the soak runs the crons, as an
operator would with ``crons run NAME``: ``WebhookBackfillCronJob`` (then waits
for the pipeline to drain again), ``BillingReconcileCronJob`` and
``IdentityReconcileCronJob``; the run must still end with nothing lost.

Two settings let them act in a run of minutes (``CRON_ENV``): the sending is
over, so no event is still on its way and the backfill's grace is 0; and every
linked workspace counts as due for the billing reconciliation (as ``--all``),
since all were synced minutes ago. The soak pins the crons' own schedules to a
date it does not run on (``cluster.NEVER_RUNS``), so nothing repairs before it
asks.

Never dropped: the doomed events (another check's subject), and the events the
scenarios wait on before acting, as an app would (``checkout.session.completed``:
a customer's charges are disputed once it is linked; ``organization.created``:
its owner checks out once the workspace exists).
"""

from __future__ import annotations

import asyncio
import random
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from app.testing.processes import child_env
from bench.soak.cluster import ROOT, Cluster
from bench.soak.config import SoakConfig
from bench.soak.fault_record import FaultRecord
from bench.soak.findings import gap_alerts
from bench.soak.plan import Event

NAME = "endpoint outage"
NEVER_DROPPED = frozenset({"checkout.session.completed", "organization.created"})
COMMAND_TIMEOUT_SECONDS = 300.0
CRONS = ("WebhookBackfillCronJob", "BillingReconcileCronJob", "IdentityReconcileCronJob")
CRON_ENV = {"WEBHOOK_BACKFILL_GRACE_SECONDS": "0", "BILLING_RECONCILE_AFTER_HOURS": "0"}
# Each cron's summary line (logged), kept for the fault's row.
_SUMMARIES = {
    "WebhookBackfillCronJob": re.compile(r"Backfilled \d+ Stripe events? \(\d+ already in the inbox\)\."),
    "BillingReconcileCronJob": re.compile(r"Reconciled \d+ workspaces; \d+ differed\."),
    "IdentityReconcileCronJob": re.compile(r"Reconciled \d+ Clerk objects; \d+ differed\."),
}


@dataclass
class Repair:
    """What the crons did after the sending phase."""

    backfilled: int = -1
    drained: float | None = None
    billing_differed: int = -1
    lines: dict[str, str] = field(default_factory=dict)  # cron -> its summary line


@dataclass
class EndpointOutage:
    config: SoakConfig
    rng: random.Random
    dropped: list[Event] = field(default_factory=list)

    @property
    def window(self) -> tuple[float, float]:
        span = self.config.send_seconds
        return self.config.outage_from * span, self.config.outage_to * span

    def drops(self, event: Event, now: float) -> bool:
        """Whether the outage swallows this event, due at ``now`` run seconds (asked once per event)."""
        start, end = self.window
        if event.doomed or event.type in NEVER_DROPPED or not start <= now < end:
            return False
        if self.rng.random() >= self.config.outage_drop_share:
            return False
        event.dropped = True
        self.dropped.append(event)
        return True

    def counts(self) -> Counter[str]:
        return Counter(event.provider for event in self.dropped)

    async def repair(self, cluster: Cluster, drain: Callable[[], Awaitable[float | None]]) -> Repair:
        """The backfill cron, wait for the backfilled events (``drain``), then both reconciliation crons together."""
        done = Repair()
        line = await _cron(cluster, done, CRONS[0])
        found = re.match(r"Backfilled (\d+) ", line)
        done.backfilled = int(found.group(1)) if found else -1
        done.drained = await drain()
        # Side by side: they write different columns, and billing holds one workspace's lock at a time.
        line, _ = await asyncio.gather(_cron(cluster, done, CRONS[1]), _cron(cluster, done, CRONS[2]))
        found = re.search(r"; (\d+) differed", line)
        done.billing_differed = int(found.group(1)) if found else -1
        return done

    def record(self, at: float, done: Repair, sentry_file: Path) -> FaultRecord:
        """The fault's row: what was dropped and what each cron logged.

        ok: every dropped Stripe event of a handled type was backfilled, with one gap
        alert, the pipeline drained again, and billing reconciliation found nothing the
        backfill had left to correct (it would hide a fault of the event pipeline).
        """
        counts = self.counts()
        wanted = sum(1 for event in self.dropped if event.provider == "stripe" and not event.ignored)
        start, end = self.window
        printed = "; ".join(f"`{command}`: {line}" for command, line in sorted(done.lines.items(), key=_in_order))
        drain = "did not drain" if done.drained is None else f"drained {done.drained:.0f} s after the backfill"
        alerts = gap_alerts(sentry_file)
        note = (
            f"{sum(event.copies for event in self.dropped)} deliveries dropped ({counts['stripe']} Stripe, "
            f"{counts['clerk']} Clerk events) from {start:.0f} to {end:.0f} s; {printed}; {drain}; "
            f"{alerts} gap alert(s)"
        )
        if done.backfilled != wanted:
            note += f"; expected {wanted} backfilled"
        ok = done.backfilled == wanted and done.drained is not None and done.billing_differed == 0
        ok = ok and alerts == (1 if wanted else 0)
        return FaultRecord(NAME, at, note, ok)


def _in_order(item: tuple[str, str]) -> int:
    """The crons in the order they began (the reconciliations run side by side)."""
    return CRONS.index(item[0])


async def _cron(cluster: Cluster, done: Repair, name: str) -> str:
    """``crons run NAME`` with the API's environment (and ``CRON_ENV``); its summary line, kept for the row."""
    command = [sys.executable, "-m", "litestar", "--app", "app.asgi:create_app", "crons", "run", name]
    began = time.monotonic()
    finished = await asyncio.to_thread(
        subprocess.run,
        command,
        cwd=ROOT,
        env=child_env({**cluster.env(), **CRON_ENV}),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_SECONDS,
    )
    summaries = _SUMMARIES[name].findall(finished.stderr)  # the log (JSON lines on stderr)
    line = summaries[-1] if summaries else f"no summary logged: {finished.stdout.strip()[-200:]}"
    if finished.returncode:
        line = f"FAILED (exit {finished.returncode}): {finished.stderr.strip()[-500:]}"
    done.lines[name] = line
    print(f"soak: crons run {name} ({time.monotonic() - began:.1f} s): {line}", flush=True)
    return line
