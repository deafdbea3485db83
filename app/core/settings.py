"""One settings object, read from the environment and validated at start.

Each field says, once, its default, the variable it is read from, how that
variable is parsed (``setting_types``) and whether it is secret. A malformed
value raises :class:`SettingsError` with one line that names the variable and
the fix; entry points print that line and exit non-zero, so a bad deploy fails
at start instead of at the first request. Cron patterns are checked here too,
so a typo in one stops the API and the worker alike.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from functools import lru_cache
from typing import Any, Literal

from app.core import setting_types as kind
from app.core.redaction import MIN_SECRET_LENGTH, redact_url, url_passwords
from app.core.setting_types import Parser, SettingsError

__all__ = ["STRIPE_API_DEFAULT", "Settings", "SettingsError", "get_settings", "load_settings"]

AppEnv = Literal["development", "test", "production"]
STRIPE_API_DEFAULT = "https://api.stripe.com"
CLERK_API_DEFAULT = "https://api.clerk.com/v1"
OPS_PASSWORD_MIN_LENGTH = 12
HIDDEN = "***"
Secret = Literal["value", "url"] | None


@dataclass(frozen=True)
class EnvVar:
    name: str
    parse: Parser
    secret: Secret = None
    """``value``: never printed and scrubbed from logs and Sentry; ``url``: the same for the URL's password."""


def env(name: str, parse: Parser = kind.text, *, secret: Secret = None) -> dict[str, EnvVar]:
    return {"env": EnvVar(name, parse, secret)}


_CRON = kind.cron_pattern


@dataclass(frozen=True, repr=False)
class Settings:
    app_env: AppEnv = field(
        default="development", metadata=env("APP_ENV", kind.choice("development", "test", "production"))
    )
    database_url: str | None = field(default=None, metadata=env("DATABASE_URL", kind.database_url, secret="url"))
    redis_url: str | None = field(default=None, metadata=env("REDIS_URL", kind.redis_url, secret="url"))
    redis_namespace: str = field(default="", metadata=env("REDIS_NAMESPACE"))
    message_queue_driver: Literal["arq", "sync"] = field(
        default="arq", metadata=env("MESSAGE_QUEUE_DRIVER", kind.choice("arq", "sync"))
    )
    billing_provider: Literal["stripe", "none"] = field(
        default="stripe", metadata=env("BILLING_PROVIDER", kind.choice("stripe", "none"))
    )
    stripe_api_key: str = field(default="", metadata=env("STRIPE_API_KEY", secret="value"))
    stripe_api_base: str = field(default=STRIPE_API_DEFAULT, metadata=env("STRIPE_API_BASE", kind.http_url))
    stripe_api_timeout_seconds: float = field(
        default=10.0, metadata=env("STRIPE_API_TIMEOUT_SECONDS", kind.number(0.1))
    )
    stripe_api_rate_limit_per_second: int = field(
        default=20, metadata=env("STRIPE_API_RATE_LIMIT_PER_SECOND", kind.whole(1))
    )
    stripe_webhook_secrets: tuple[str, ...] = field(
        default=(), metadata=env("STRIPE_WEBHOOK_SECRET", kind.whsec_list, secret="value")
    )
    # What the Stripe event destinations of this endpoint send (snapshot, thin, or both while moving from one to the
    # other): which of Stripe's Events APIs the backfill lists. Intake takes both whatever it says.
    stripe_event_payloads: tuple[str, ...] = field(
        default=("snapshot",), metadata=env("STRIPE_EVENT_PAYLOADS", kind.choices("snapshot", "thin"))
    )
    clerk_webhook_signing_secret: str | None = field(
        default=None, metadata=env("CLERK_WEBHOOK_SIGNING_SECRET", kind.whsec, secret="value")
    )
    clerk_secret_key: str | None = field(default=None, metadata=env("CLERK_SECRET_KEY", secret="value"))
    clerk_api_base: str = field(default=CLERK_API_DEFAULT, metadata=env("CLERK_API_BASE", kind.http_url))
    webhook_rate_limit_per_minute: int = field(
        default=600, metadata=env("WEBHOOK_RATE_LIMIT_PER_MINUTE", kind.whole(1))
    )
    trusted_proxies: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = field(
        default=(), metadata=env("TRUSTED_PROXIES", kind.trusted_proxies)
    )
    webhook_max_body_bytes: int = field(default=1_048_576, metadata=env("WEBHOOK_MAX_BODY_BYTES", kind.whole(1)))
    webhook_retry_limit: int = field(default=10, metadata=env("WEBHOOK_RETRY_LIMIT", kind.whole(0)))
    webhook_retry_base_seconds: float = field(default=5.0, metadata=env("WEBHOOK_RETRY_BASE_SECONDS", kind.number(0)))
    webhook_job_timeout_seconds: int = field(default=120, metadata=env("WEBHOOK_JOB_TIMEOUT_SECONDS", kind.whole(1)))
    # Idle this long while it holds an event's lock, a processing attempt's session is ended by Postgres (and the lock).
    webhook_lock_idle_timeout_seconds: int = field(
        default=30, metadata=env("WEBHOOK_LOCK_IDLE_TIMEOUT_SECONDS", kind.whole(1))
    )
    free_plan_member_limit: int = field(default=3, metadata=env("FREE_PLAN_MEMBER_LIMIT", kind.whole(0)))
    webhook_recovery_cron: str = field(default="*/10 * * * *", metadata=env("WEBHOOK_RECOVERY_CRON", _CRON))
    webhook_recovery_after_seconds: int = field(
        default=900, metadata=env("WEBHOOK_RECOVERY_AFTER_SECONDS", kind.whole(0))
    )
    webhook_abandon_after_attempts: int = field(
        default=33, metadata=env("WEBHOOK_ABANDON_AFTER_ATTEMPTS", kind.whole(1))
    )
    webhook_retention_cron: str = field(default="30 3 * * *", metadata=env("WEBHOOK_RETENTION_CRON", _CRON))
    webhook_event_retention_days: int = field(default=30, metadata=env("WEBHOOK_EVENT_RETENTION_DAYS", kind.whole(0)))
    # The change journal holds names and emails: kept this long, then deleted by the retention cron.
    workspace_change_retention_days: int = field(
        default=90, metadata=env("WORKSPACE_CHANGE_RETENTION_DAYS", kind.whole(0))
    )
    webhook_backfill_cron: str = field(default="17 * * * *", metadata=env("WEBHOOK_BACKFILL_CRON", _CRON))
    # Stripe keeps events 30 days: a longer lookback would only ask for what is gone.
    webhook_backfill_lookback_hours: int = field(
        default=72, metadata=env("WEBHOOK_BACKFILL_LOOKBACK_HOURS", kind.whole(1, 720))
    )
    # An event younger than this may still be on its way: that cron leaves it to its delivery (or the next run).
    webhook_backfill_grace_seconds: int = field(
        default=60, metadata=env("WEBHOOK_BACKFILL_GRACE_SECONDS", kind.whole(0, 3600))
    )
    billing_reconcile_cron: str = field(default="45 4 * * *", metadata=env("BILLING_RECONCILE_CRON", _CRON))
    billing_reconcile_after_hours: int = field(default=24, metadata=env("BILLING_RECONCILE_AFTER_HOURS", kind.whole(0)))
    identity_reconcile_cron: str = field(default="15 5 * * *", metadata=env("IDENTITY_RECONCILE_CRON", _CRON))
    upstream_hold_after_subjects: int = field(default=3, metadata=env("UPSTREAM_HOLD_AFTER_SUBJECTS", kind.whole(1)))
    upstream_probe_seconds: float = field(default=30.0, metadata=env("UPSTREAM_PROBE_SECONDS", kind.number(0.1)))
    worker_shutdown_grace_seconds: int = field(default=60, metadata=env("WORKER_SHUTDOWN_GRACE_SECONDS", kind.whole(0)))
    worker_poll_delay_seconds: float = field(
        default=0.01, metadata=env("WORKER_POLL_DELAY_SECONDS", kind.number(0.001))
    )
    worker_max_jobs: int = field(default=20, metadata=env("WORKER_MAX_JOBS", kind.whole(1)))
    worker_metrics_port: int = field(default=9108, metadata=env("WORKER_METRICS_PORT", kind.whole(0, 65535)))
    sentry_dsn: str | None = field(default=None, metadata=env("SENTRY_DSN", kind.sentry_dsn))
    # OpenTelemetry's own variables: the SDK reads them itself; these decide whether tracing is on, are checked at
    # start, and keep the exporter's credentials out of logs, Sentry events and spans.
    otel_exporter_otlp_endpoint: str | None = field(
        default=None, metadata=env("OTEL_EXPORTER_OTLP_ENDPOINT", kind.http_url, secret="url")
    )
    otel_exporter_otlp_headers: tuple[str, ...] = field(
        default=(), metadata=env("OTEL_EXPORTER_OTLP_HEADERS", kind.header_values, secret="value")
    )
    otel_sdk_disabled: bool = field(default=False, metadata=env("OTEL_SDK_DISABLED", kind.flag))
    ops_password: str | None = field(
        default=None, metadata=env("OPS_PASSWORD", kind.password(OPS_PASSWORD_MIN_LENGTH), secret="value")
    )
    metrics_token: str | None = field(default=None, metadata=env("METRICS_TOKEN", secret="value"))
    # Unset: console in development and test, json in production.
    log_format: Literal["console", "json"] = field(
        default="console", metadata=env("LOG_FORMAT", kind.choice("console", "json"))
    )
    log_level: str = field(
        default="INFO", metadata=env("LOG_LEVEL", kind.choice("debug", "info", "warning", "error", upper=True))
    )

    def __repr__(self) -> str:
        return f"Settings({', '.join(f'{item.name}={self._shown(item)}' for item in fields(self))})"

    def _shown(self, item: Field[Any]) -> str:
        value, secret = getattr(self, item.name), _var(item).secret
        if not secret or not value:
            return repr(value)
        return repr(redact_url(value) if secret == "url" else HIDDEN)

    def secret_values(self) -> tuple[str, ...]:
        """Every configured secret, each once: what the log and Sentry scrubbers remove."""
        found: dict[str, None] = {}
        for item in fields(self):
            value, secret = getattr(self, item.name), _var(item).secret
            if not secret or not value:
                continue
            if secret == "url":
                found.update(dict.fromkeys(url_passwords(value)))
            else:
                found.update(dict.fromkeys(value if isinstance(value, tuple) else (value,)))
        return tuple(found)

    def secrets_too_short_to_scrub(self) -> tuple[str, ...]:
        """The variables holding a secret shorter than ``MIN_SECRET_LENGTH``, which the scrubbers leave in
        (it would match ordinary text): start-up warns about each, by name."""
        names = []
        for item in fields(self):
            value, var = getattr(self, item.name), _var(item)
            if not var.secret or not value:
                continue
            values = url_passwords(value) if var.secret == "url" else value if isinstance(value, tuple) else (value,)
            if any(len(each) < MIN_SECRET_LENGTH for each in values):
                names.append(var.name)
        return tuple(names)

    @property
    def is_production(self) -> bool:
        return self.app_env == "production"

    @property
    def stripe_enabled(self) -> bool:
        return self.billing_provider == "stripe"

    @property
    def clerk_enabled(self) -> bool:
        return bool(self.clerk_webhook_signing_secret)

    def require_database_url(self) -> str:
        if not self.database_url:
            raise SettingsError(
                "DATABASE_URL is not set: set it to postgresql+asyncpg://user:password@host:5432/db, or run the "
                'command through make (`make cli ARGS="..."`), which starts an embedded Postgres and sets it for you.'
            )
        return self.database_url

    def require_redis_url(self) -> str:
        if not self.redis_url:
            raise SettingsError(
                "REDIS_URL is not set: set it to redis://host:6379/0, or run the command through make "
                '(`make cli ARGS="..."`), which starts an embedded Redis and sets it for you.'
            )
        return self.redis_url


def _var(item: Field[Any]) -> EnvVar:
    var: EnvVar = item.metadata["env"]
    return var


def env_var_name(field_name: str) -> str:
    """The environment variable a field is read from (``webhook_recovery_cron`` -> ``WEBHOOK_RECOVERY_CRON``)."""
    return next(_var(item).name for item in fields(Settings) if item.name == field_name)


def _production_checks(settings: Settings) -> None:
    if not settings.is_production:
        return
    if settings.stripe_enabled and not settings.stripe_webhook_secrets:
        raise SettingsError(
            "STRIPE_WEBHOOK_SECRET is not set and APP_ENV=production: set the whsec_ secret of the Stripe "
            "webhook endpoint, or BILLING_PROVIDER=none to switch billing off."
        )
    if settings.stripe_enabled and not settings.stripe_api_key:
        raise SettingsError(
            "STRIPE_API_KEY is not set and APP_ENV=production: set the Stripe secret key (sk_live_...), "
            "or BILLING_PROVIDER=none to switch billing off."
        )
    for name, value in (("DATABASE_URL", settings.database_url), ("REDIS_URL", settings.redis_url)):
        if not value:
            raise SettingsError(f"{name} is not set and APP_ENV=production: embedded servers are for development.")


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Read and validate every setting; an unset or empty variable keeps the field's default."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for item in fields(Settings):
        var = _var(item)
        raw = (env.get(var.name) or "").strip()
        if raw:
            values[item.name] = var.parse(var.name, raw)
    if "log_format" not in values and values.get("app_env") == "production":
        values["log_format"] = "json"
    settings = Settings(**values)
    _production_checks(settings)
    return settings


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings; tests call ``get_settings.cache_clear()`` after changing the environment."""
    return load_settings()
