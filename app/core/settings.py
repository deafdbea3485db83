"""One settings object, read from the environment and validated at start.

A malformed value raises :class:`SettingsError` with one line that names the
variable and the fix; entry points print that line and exit non-zero, so a bad
deploy fails at start instead of at the first request.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from functools import lru_cache
from typing import Any, Literal

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from app.core.redaction import redact_url, url_passwords

AppEnv = Literal["development", "test", "production"]
STRIPE_API_DEFAULT = "https://api.stripe.com"


class SettingsError(Exception):
    """A setting is missing or malformed; the message names the variable and the fix."""


# A field's ``secret`` metadata is the one place that decides what is secret: its value (or a URL's
# password) never prints in a repr, and every log line and Sentry event is scrubbed of it.
_SECRET: dict[str, str] = {"secret": "value"}
_SECRET_URL: dict[str, str] = {"secret": "url"}
HIDDEN = "***"


@dataclass(frozen=True, repr=False)
class Settings:
    app_env: AppEnv = "development"
    database_url: str | None = field(default=None, metadata=_SECRET_URL)
    redis_url: str | None = field(default=None, metadata=_SECRET_URL)
    redis_namespace: str = ""
    message_queue_driver: Literal["arq", "sync"] = "arq"
    billing_provider: Literal["stripe", "none"] = "stripe"
    stripe_api_key: str = field(default="", metadata=_SECRET)
    stripe_api_base: str = STRIPE_API_DEFAULT
    stripe_api_timeout_seconds: float = 10.0
    stripe_webhook_secrets: tuple[str, ...] = field(default=(), metadata=_SECRET)
    clerk_webhook_signing_secret: str | None = field(default=None, metadata=_SECRET)
    clerk_secret_key: str | None = field(default=None, metadata=_SECRET)
    webhook_rate_limit_per_minute: int = 600
    trusted_proxies: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    webhook_max_body_bytes: int = 1_048_576
    webhook_retry_limit: int = 10
    webhook_retry_base_seconds: float = 5.0
    webhook_job_timeout_seconds: int = 120
    free_plan_member_limit: int = 3
    webhook_recovery_cron: str = "*/10 * * * *"
    webhook_recovery_after_seconds: int = 900
    webhook_abandon_after_attempts: int = 33
    webhook_retention_cron: str = "30 3 * * *"
    webhook_event_retention_days: int = 30
    worker_shutdown_grace_seconds: int = 60
    worker_poll_delay_seconds: float = 0.01
    worker_max_jobs: int = 20
    sentry_dsn: str | None = None
    ops_password: str | None = field(default=None, metadata=_SECRET)
    metrics_token: str | None = field(default=None, metadata=_SECRET)
    log_format: Literal["console", "json"] = "console"
    log_level: str = "INFO"

    def __repr__(self) -> str:
        return f"Settings({', '.join(f'{item.name}={self._shown(item)}' for item in fields(self))})"

    def _shown(self, item: Field[Any]) -> str:
        value = getattr(self, item.name)
        kind = item.metadata.get("secret")
        if not kind or not value:
            return repr(value)
        return repr(redact_url(value) if kind == "url" else HIDDEN)

    def secret_values(self) -> tuple[str, ...]:
        """Every configured secret, each once: what the log and Sentry scrubbers remove."""
        found: dict[str, None] = {}
        for item in fields(self):
            kind = item.metadata.get("secret")
            value = getattr(self, item.name)
            if not kind or not value:
                continue
            if kind == "url":
                found.update(dict.fromkeys(url_passwords(value)))
            else:
                found.update(dict.fromkeys(value if isinstance(value, tuple) else (value,)))
        return tuple(found)

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
                "DATABASE_URL is not set: set it to postgresql+asyncpg://user:password@host:5432/db "
                "(`make dev` starts an embedded Postgres and sets it for you)."
            )
        return self.database_url

    def require_redis_url(self) -> str:
        if not self.redis_url:
            raise SettingsError(
                "REDIS_URL is not set: set it to redis://host:6379/0 "
                "(`make dev` starts an embedded Redis and sets it for you)."
            )
        return self.redis_url


def _get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def _choice(env: Mapping[str, str], name: str, default: str, allowed: tuple[str, ...]) -> str:
    value = (_get(env, name) or default).lower()
    if value not in allowed:
        raise SettingsError(f"{name}={value!r} is not valid: use one of {', '.join(allowed)}.")
    return value


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = _get(env, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a whole number: set it to an integer >= {minimum}.") from None
    if value < minimum:
        raise SettingsError(f"{name}={value} is too small: set it to an integer >= {minimum}.")
    return value


def _float(env: Mapping[str, str], name: str, default: float, minimum: float = 0.0) -> float:
    raw = _get(env, name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number: set it to a number >= {minimum}.") from None
    if value < minimum:
        raise SettingsError(f"{name}={value} is too small: set it to a number >= {minimum}.")
    return value


def _database_url(env: Mapping[str, str]) -> str | None:
    raw = _get(env, "DATABASE_URL")
    if raw is None:
        return None
    try:
        url = make_url(raw)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise SettingsError(
            f"DATABASE_URL={redact_url(raw)!r} does not parse: use postgresql+asyncpg://user:password@host:5432/db."
        ) from None
    if url.get_backend_name() != "postgresql":
        raise SettingsError(
            f"DATABASE_URL uses {url.drivername!r}: only PostgreSQL is supported; "
            "use postgresql+asyncpg://user:password@host:5432/db."
        )
    if url.drivername != "postgresql+asyncpg":
        url = url.set(drivername="postgresql+asyncpg")
    return url.render_as_string(hide_password=False)


def _redis_url(env: Mapping[str, str]) -> str | None:
    raw = _get(env, "REDIS_URL")
    if raw is None:
        return None
    scheme, sep, rest = raw.partition("://")
    if not sep or scheme not in ("redis", "rediss", "unix") or not rest:
        raise SettingsError(
            f"REDIS_URL={redact_url(raw)!r} does not parse: use redis://host:6379/0 (or rediss:// for TLS)."
        )
    return raw


def _http_url(env: Mapping[str, str], name: str, default: str) -> str:
    raw = _get(env, name) or default
    scheme, sep, rest = raw.partition("://")
    if scheme not in ("http", "https") or not sep or not rest.split("/")[0]:
        raise SettingsError(f"{name}={redact_url(raw)!r} does not parse: use an http(s) URL such as {default}.")
    return raw.rstrip("/")


def check_whsec(name: str, secret: str) -> str:
    """A ``whsec_`` secret must carry base64 after its prefix (svix decodes it; Stripe's do too)."""
    if not secret.startswith("whsec_"):
        raise SettingsError(
            f"{name} must start with 'whsec_': copy the signing secret from the provider's webhook settings."
        )
    body = secret.removeprefix("whsec_")
    try:
        decoded = base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
    except (binascii.Error, ValueError):
        decoded = b""
    if len(decoded) < 8:
        raise SettingsError(
            f"{name} has a 'whsec_' secret that does not decode (base64 expected after 'whsec_'): "
            "copy it again from the provider's webhook settings."
        )
    return secret


def _stripe_secrets(env: Mapping[str, str]) -> tuple[str, ...]:
    raw = _get(env, "STRIPE_WEBHOOK_SECRET")
    if raw is None:
        return ()
    parts = [part.strip() for part in raw.split(",") if part.strip()]
    return tuple(check_whsec("STRIPE_WEBHOOK_SECRET", part) for part in parts)


def _trusted_proxies(env: Mapping[str, str]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    from app.webhooks.client_ip import parse_trusted_proxies

    raw = _get(env, "TRUSTED_PROXIES")
    if raw is None:
        return ()
    try:
        return tuple(parse_trusted_proxies(raw))
    except ValueError as exc:
        raise SettingsError(f"TRUSTED_PROXIES: {exc}") from None


def _sentry_dsn(env: Mapping[str, str]) -> str | None:
    raw = _get(env, "SENTRY_DSN")
    if raw is None:
        return None
    from app.core.sentry import is_valid_dsn  # imported here: app.core.sentry imports this module

    if not is_valid_dsn(raw):
        raise SettingsError(
            "SENTRY_DSN does not parse: copy the DSN from Sentry (Settings > Client Keys), "
            "e.g. https://<key>@o0.ingest.sentry.io/<project>, or unset it to switch Sentry off."
        )
    return raw


def check_cron_pattern(name: str, pattern: str) -> str:
    """Exactly five croniter fields: croniter also takes 6 and 7 (seconds last), which we refuse."""
    from croniter import croniter

    if len(pattern.split()) != 5 or not croniter.is_valid(pattern, strict=True):
        raise SettingsError(
            f"{name}={pattern!r} is not a valid cron pattern: use 5 fields "
            "(minute hour day-of-month month day-of-week), e.g. '*/10 * * * *'."
        )
    return pattern


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


def load_settings(env: Mapping[str, str] | None = None, *, check_crons: bool = False) -> Settings:
    """Read and validate every setting; ``check_crons`` is the worker's extra check."""
    env = os.environ if env is None else env
    app_env = _choice(env, "APP_ENV", "development", ("development", "test", "production"))
    clerk_secret = _get(env, "CLERK_WEBHOOK_SIGNING_SECRET")
    settings = Settings(
        app_env=app_env,  # type: ignore[arg-type]
        database_url=_database_url(env),
        redis_url=_redis_url(env),
        redis_namespace=_get(env, "REDIS_NAMESPACE") or "",
        message_queue_driver=_choice(env, "MESSAGE_QUEUE_DRIVER", "arq", ("arq", "sync")),  # type: ignore[arg-type]
        billing_provider=_choice(env, "BILLING_PROVIDER", "stripe", ("stripe", "none")),  # type: ignore[arg-type]
        stripe_api_key=_get(env, "STRIPE_API_KEY") or "",
        stripe_api_base=_http_url(env, "STRIPE_API_BASE", STRIPE_API_DEFAULT),
        stripe_api_timeout_seconds=_float(env, "STRIPE_API_TIMEOUT_SECONDS", 10.0, 0.1),
        stripe_webhook_secrets=_stripe_secrets(env),
        clerk_webhook_signing_secret=(
            check_whsec("CLERK_WEBHOOK_SIGNING_SECRET", clerk_secret) if clerk_secret else None
        ),
        clerk_secret_key=_get(env, "CLERK_SECRET_KEY"),
        webhook_rate_limit_per_minute=_int(env, "WEBHOOK_RATE_LIMIT_PER_MINUTE", 600, 1),
        trusted_proxies=_trusted_proxies(env),
        webhook_max_body_bytes=_int(env, "WEBHOOK_MAX_BODY_BYTES", 1_048_576, 1),
        webhook_retry_limit=_int(env, "WEBHOOK_RETRY_LIMIT", 10, 0),
        webhook_retry_base_seconds=_float(env, "WEBHOOK_RETRY_BASE_SECONDS", 5.0, 0.0),
        webhook_job_timeout_seconds=_int(env, "WEBHOOK_JOB_TIMEOUT_SECONDS", 120, 1),
        free_plan_member_limit=_int(env, "FREE_PLAN_MEMBER_LIMIT", 3, 0),
        webhook_recovery_cron=_get(env, "WEBHOOK_RECOVERY_CRON") or "*/10 * * * *",
        webhook_recovery_after_seconds=_int(env, "WEBHOOK_RECOVERY_AFTER_SECONDS", 900, 0),
        webhook_abandon_after_attempts=_int(env, "WEBHOOK_ABANDON_AFTER_ATTEMPTS", 33, 1),
        webhook_retention_cron=_get(env, "WEBHOOK_RETENTION_CRON") or "30 3 * * *",
        webhook_event_retention_days=_int(env, "WEBHOOK_EVENT_RETENTION_DAYS", 30, 0),
        worker_shutdown_grace_seconds=_int(env, "WORKER_SHUTDOWN_GRACE_SECONDS", 60, 0),
        worker_poll_delay_seconds=_float(env, "WORKER_POLL_DELAY_SECONDS", 0.01, 0.001),
        worker_max_jobs=_int(env, "WORKER_MAX_JOBS", 20, 1),
        sentry_dsn=_sentry_dsn(env),
        ops_password=_get(env, "OPS_PASSWORD"),
        metrics_token=_get(env, "METRICS_TOKEN"),
        log_format=_choice(  # type: ignore[arg-type]
            env, "LOG_FORMAT", "json" if app_env == "production" else "console", ("console", "json")
        ),
        log_level=_choice(env, "LOG_LEVEL", "info", ("debug", "info", "warning", "error")).upper(),
    )
    if check_crons:
        check_cron_pattern("WEBHOOK_RECOVERY_CRON", settings.webhook_recovery_cron)
        check_cron_pattern("WEBHOOK_RETENTION_CRON", settings.webhook_retention_cron)
    _production_checks(settings)
    return settings


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings; tests call ``get_settings.cache_clear()`` after changing the environment."""
    return load_settings()
