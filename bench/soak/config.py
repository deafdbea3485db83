"""The soak's knobs: how much it sends, how fast, and the product settings it runs under.

The product settings are chosen so every fault heals within the run: a failed
event is retried 7 times from 0.1 s doubling (one round lasts ~13 s), a killed
worker's job runs again after its 5 s timeout plus arq's margins (~17 s), the
recovery cron runs every minute and re-queues what is 5 s old, and an event is
set aside after 8 attempts, which only the events meant to fail reach: the
Stripe outage, longer than a whole round of retries, holds the ``stripe``
upstream after its first three failing subjects (probed every 2 s), so it
costs a healthy event at most one failed attempt, a killed worker or a
Postgres crash one more each, and flaky reads are never armed around the
outage.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_EVENTS = 10_000
SHORT_EVENTS = 400


@dataclass(frozen=True)
class SoakConfig:
    events: int = DEFAULT_EVENTS  # deliveries to send (first deliveries and planned duplicates)
    rate: float = 40.0  # deliveries per second, on average
    seed: int = 8
    short: bool = False
    concurrency: int = 48  # requests in flight at most
    rate_limit: int = 40  # WEBHOOK_RATE_LIMIT_PER_MINUTE, per client IP and route
    normal_ips: int = 256  # the providers' senders, spread so none nears the limit
    noisy_requests_per_limit: int = 3  # the noisy IP sends this many times the limit
    resend_deadline_seconds: float = 150.0  # a provider gives up on a delivery after this (we fail the run)
    drain_timeout_seconds: float = 240.0
    # faults
    kill_restart_after_seconds: float = 3.0
    stripe_outage_seconds: float = 30.0  # longer than a round of retries (12.7 s): without a hold, set aside
    stripe_outage_at: float = 0.55  # its start, as a share of the sending phase
    redis_down_seconds: float = 2.0
    postgres_down_seconds: float = 2.0
    # the endpoint outage (outage.py): this share of the deliveries due in this part of the sending phase is lost
    outage_from: float = 0.72
    outage_to: float = 0.86
    outage_drop_share: float = 0.5
    # product settings for the run
    retry_limit: int = 7
    retry_base_seconds: float = 0.1
    job_timeout_seconds: int = 5
    recovery_after_seconds: int = 5
    abandon_after_attempts: int = 8
    stripe_timeout_seconds: float = 1.0
    upstream_probe_seconds: float = 2.0
    free_plan_member_limit: int = 3
    shutdown_grace_seconds: int = 10
    worker_max_jobs: int = 8
    log_level: str = "info"

    @property
    def send_seconds(self) -> float:
        return self.events / self.rate

    @property
    def doomed_events(self) -> int:
        """Events whose Stripe reads fail forever: they must end set aside, with one alert each."""
        return max(5, self.events // 500)

    @classmethod
    def short_run(cls, **overrides: object) -> SoakConfig:
        """A few hundred events, every fault once: the test suite's version (about a minute)."""
        values: dict[str, object] = {"events": SHORT_EVENTS, "rate": 16.0, "short": True}
        values["drain_timeout_seconds"] = 150.0
        values["outage_from"] = 0.60  # a wider window: in a few hundred events, both providers surely lose some
        values["stripe_outage_seconds"] = 16.0  # still longer than a round of retries
        # After the endpoint outage: Stripe's scenarios wait while its stub is down, so an outage spanning the
        # endpoint outage's window would leave it no Stripe delivery to drop.
        values["stripe_outage_at"] = 0.88
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]
