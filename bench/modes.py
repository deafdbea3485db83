"""The sizes of a run: `--smoke` (seconds), quick (the default), `--full`; `--set FIELD=VALUE` overrides one."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mode:
    name: str
    intake_seconds: float
    intake_warmup_seconds: float
    intake_rounds: int
    pipeline_seconds: float
    pipeline_warmup_seconds: float
    drain_events: int
    crons_processed: int
    crons_pending: int
    pipeline_load: float = 0.5  # the pipeline's steady load, as a share of one worker's Clerk drain rate just measured
    pipeline_reference_events: int = 5_000  # that drain, at most (fewer when drain_events is smaller)
    keep_processes: bool = False  # start each process once, keep it for every phase (bench/fleet.py)
    worker_max_jobs: int = 20  # WORKER_MAX_JOBS, the product's default (each job in flight holds a connection or two)
    connections: int = 64
    reference_drains_2w: bool = True  # the no-op and UPDATE jobs by two workers too (for the record)
    drain_rounds: int = 1  # one worker's Clerk and reference drains, in mirrored order: rates over all rounds
    # stripe_backlog: the backlog's events and the customers they are about
    stripe_backlog_events: int = 2_000
    stripe_backlog_customers: int = 200
    # thin_backlog: the stripe_backlog's events as thin events, then as many about this many customers never seen
    thin_backlog_unknown_customers: int = 20
    # outage: Stripe events of these customers arriving while Stripe answers 500 for this long; the probe interval
    outage_events: int = 2_000
    outage_customers: int = 200
    outage_seconds: float = 180.0
    outage_probe_seconds: float = 30.0
    # isolation: a Clerk flood, and Stripe events of other customers delivered at this rate while it drains
    isolation_flood: int = 3_000
    isolation_probe_rate: float = 5.0
    # fairness: a flood of one Clerk organization, and events of other organizations at this rate meanwhile
    fairness_flood: int = 3_000
    fairness_orgs: int = 50
    fairness_probe_rate: float = 10.0
    # adapter: jobs queued per way of queueing, the batch size (the recovery cron's page), rounds (medians)
    adapter_jobs: int = 2_000
    adapter_batch: int = 500
    adapter_rounds: int = 3
    # metrics_cost: intake rounds of each kind, and the order of its drains (a slow moment hits both kinds alike)
    metrics_intake_rounds: int = 3
    metrics_drains: tuple[str, ...] = ("on", "off", "off", "on", "on", "off")
    # tracing_cost: the same, with tracing on (every span exported) and off
    tracing_intake_rounds: int = 3
    tracing_drains: tuple[str, ...] = ("on", "off", "off", "on", "on", "off")
    tracing_sampled_ratio: float | None = 0.1
    """Also measured: tracing on at this sampling ratio (``parentbased_traceidratio``); None: not measured."""
    # journal cost (drain phase): the order of its drains, one worker each, with the journal and without
    journal_drains: tuple[str, ...] = ("on", "off", "off", "on")
    # timeline: the inbox's rows, the workspace's events and journal rows among them, the requests timed
    timeline_inbox_rows: int = 200_000
    timeline_workspace_events: int = 10_000
    timeline_journal_rows: int = 10_000
    timeline_requests: int = 50


MODES = {
    "smoke": Mode(
        "smoke",
        1.0,
        0.0,
        1,
        1.5,
        0.5,
        200,
        5_000,
        100,
        reference_drains_2w=False,
        stripe_backlog_events=200,
        stripe_backlog_customers=20,
        thin_backlog_unknown_customers=5,
        outage_events=200,
        outage_customers=20,
        outage_seconds=12.0,
        outage_probe_seconds=3.0,
        isolation_flood=200,
        fairness_flood=200,
        fairness_orgs=10,
        adapter_jobs=200,
        adapter_batch=50,
        adapter_rounds=1,
        metrics_intake_rounds=1,
        metrics_drains=("on", "off"),
        keep_processes=True,
        worker_max_jobs=5,  # its kept workers serve every phase: fewer connections to a shared Postgres
        connections=16,  # the intake's: its kept API's pool grows to as many
        tracing_intake_rounds=1,
        tracing_drains=("on", "off"),
        tracing_sampled_ratio=None,
        journal_drains=("on", "off"),
        timeline_inbox_rows=4_000,
        timeline_workspace_events=400,
        timeline_journal_rows=400,
        timeline_requests=10,
    ),
    "quick": Mode("quick", 8.0, 2.0, 1, 15.0, 2.0, 3_000, 100_000, 1_000),
    "full": Mode(
        "full",
        15.0,
        3.0,
        3,
        60.0,
        3.0,
        20_000,
        1_000_000,
        1_000,
        drain_rounds=2,
        stripe_backlog_events=10_000,
        stripe_backlog_customers=1_000,
        thin_backlog_unknown_customers=100,
        outage_seconds=300.0,
        isolation_flood=20_000,
        fairness_flood=20_000,
        timeline_inbox_rows=1_000_000,
    ),
}
