"""Settings are validated at start, with one line naming the variable and the fix."""

from __future__ import annotations

import pytest

from app.core.logging import configure_logging
from app.core.redaction import redact_url
from app.core.settings import SettingsError, load_settings

GOOD_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def test_defaults_match_the_spec() -> None:
    settings = load_settings({})
    assert settings.message_queue_driver == "arq"
    assert settings.billing_provider == "stripe"
    assert settings.webhook_rate_limit_per_minute == 600
    assert settings.webhook_max_body_bytes == 1_048_576
    assert settings.webhook_retry_limit == 10
    assert settings.webhook_retry_base_seconds == 5
    assert settings.webhook_job_timeout_seconds == 120
    assert settings.webhook_abandon_after_attempts == 33
    assert settings.webhook_recovery_cron == "*/10 * * * *"
    assert settings.webhook_retention_cron == "30 3 * * *"
    assert settings.log_format == "console"
    assert settings.clerk_enabled is False


def test_production_logs_json_by_default() -> None:
    env = {
        "APP_ENV": "production",
        "STRIPE_WEBHOOK_SECRET": GOOD_SECRET,
        "STRIPE_API_KEY": "sk_live_x",
        "DATABASE_URL": "postgresql+asyncpg://u@db/app",
        "REDIS_URL": "redis://redis:6379/0",
    }
    assert load_settings(env).log_format == "json"


def test_several_stripe_secrets_are_read_for_rotation() -> None:
    other = "whsec_" + "A" * 32
    settings = load_settings({"STRIPE_WEBHOOK_SECRET": f"{GOOD_SECRET}, {other}"})
    assert settings.stripe_webhook_secrets == (GOOD_SECRET, other)


@pytest.mark.parametrize(
    ("raw", "payloads"),
    [
        (None, ("snapshot",)),
        ("thin", ("thin",)),
        ("thin, Snapshot", ("snapshot", "thin")),
        ("snapshot,thin", ("snapshot", "thin")),
    ],
)
def test_stripe_event_payloads_name_the_styles_the_destinations_send(
    raw: str | None, payloads: tuple[str, ...]
) -> None:
    assert load_settings({"STRIPE_EVENT_PAYLOADS": raw} if raw else {}).stripe_event_payloads == payloads


def test_plain_postgresql_url_gets_the_asyncpg_driver() -> None:
    settings = load_settings({"DATABASE_URL": "postgresql://u:p@h:5432/d"})
    assert settings.database_url == "postgresql+asyncpg://u:p@h:5432/d"


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"STRIPE_WEBHOOK_SECRET": "whsec_@@@not-base64@@@"}, "STRIPE_WEBHOOK_SECRET"),
        ({"STRIPE_WEBHOOK_SECRET": "sk_test_wrong_kind"}, "STRIPE_WEBHOOK_SECRET"),
        ({"CLERK_WEBHOOK_SIGNING_SECRET": "whsec_***"}, "CLERK_WEBHOOK_SIGNING_SECRET"),
        ({"DATABASE_URL": "not a url"}, "DATABASE_URL"),
        ({"DATABASE_URL": "mysql://u@h/d"}, "DATABASE_URL"),
        ({"REDIS_URL": "localhost:6379"}, "REDIS_URL"),
        ({"STRIPE_API_BASE": "ftp://x"}, "STRIPE_API_BASE"),
        ({"WEBHOOK_RATE_LIMIT_PER_MINUTE": "lots"}, "WEBHOOK_RATE_LIMIT_PER_MINUTE"),
        ({"MESSAGE_QUEUE_DRIVER": "celery"}, "MESSAGE_QUEUE_DRIVER"),
        ({"TRUSTED_PROXIES": "10.0.0.0/8,nope"}, "TRUSTED_PROXIES: 'nope'"),
        ({"SENTRY_DSN": "not-a-dsn"}, "SENTRY_DSN"),
        ({"OPS_PASSWORD": "eleven-char"}, "OPS_PASSWORD is shorter than 12 characters: set a longer one"),
        ({"STRIPE_EVENT_PAYLOADS": "thick"}, "STRIPE_EVENT_PAYLOADS='thick' is not valid: use snapshot, thin, or"),
        ({"STRIPE_EVENT_PAYLOADS": "snapshot,,thin"}, "STRIPE_EVENT_PAYLOADS='snapshot,,thin' is not valid"),
    ],
)
def test_malformed_values_name_the_variable(env: dict[str, str], names: str) -> None:
    with pytest.raises(SettingsError) as excinfo:
        load_settings(env)
    message = str(excinfo.value)
    assert message.startswith(names)
    assert "\n" not in message


@pytest.mark.parametrize("pattern", ["*/10 * * *", "0 0 * * * *", "61 * * * *", "every monday"])
def test_bad_cron_patterns_are_refused_at_start(pattern: str) -> None:
    with pytest.raises(SettingsError, match=r"WEBHOOK_RECOVERY_CRON.*5 fields"):
        load_settings({"WEBHOOK_RECOVERY_CRON": pattern})


def test_production_requires_the_secret_of_an_enabled_provider() -> None:
    env = {
        "APP_ENV": "production",
        "STRIPE_API_KEY": "sk_live_x",
        "DATABASE_URL": "postgresql+asyncpg://u@db/app",
        "REDIS_URL": "redis://redis:6379/0",
    }
    with pytest.raises(SettingsError, match="STRIPE_WEBHOOK_SECRET"):
        load_settings(env)
    assert load_settings({**env, "BILLING_PROVIDER": "none"}).stripe_enabled is False


SECRET_ENV = {
    "STRIPE_API_KEY": "sk_live_key_in_no_repr",
    "STRIPE_WEBHOOK_SECRET": f"{GOOD_SECRET},whsec_{'B' * 32}",
    "CLERK_WEBHOOK_SIGNING_SECRET": f"whsec_{'C' * 32}",
    "CLERK_SECRET_KEY": "sk_live_clerk_in_no_repr",
    "OPS_PASSWORD": "ops-password-in-no-repr",
    "METRICS_TOKEN": "metrics-token-in-no-repr",
    "DATABASE_URL": "postgresql+asyncpg://app:db%40pass-in-no-repr@db:5432/app",
    "REDIS_URL": "redis://:redis-pass-in-no-repr@redis:6379/0",
}
SECRETS = [
    "sk_live_key_in_no_repr",
    GOOD_SECRET,
    f"whsec_{'B' * 32}",
    f"whsec_{'C' * 32}",
    "sk_live_clerk_in_no_repr",
    "ops-password-in-no-repr",
    "metrics-token-in-no-repr",
    "db%40pass-in-no-repr",
    "db@pass-in-no-repr",
    "redis-pass-in-no-repr",
]


def test_settings_never_print_their_secrets() -> None:
    settings = load_settings(SECRET_ENV)
    for shown in (repr(settings), str(settings), f"{settings}"):
        assert [secret for secret in SECRETS if secret in shown] == []
        assert "stripe_api_key='***'" in shown
        assert "database_url='postgresql+asyncpg://app:***@db:5432/app'" in shown
        assert "redis_url='redis://:***@redis:6379/0'" in shown
        assert "log_level='INFO'" in shown  # the rest is shown as it is


def test_secret_values_name_every_configured_secret_once() -> None:
    values = load_settings(SECRET_ENV).secret_values()
    assert sorted(values) == sorted(SECRETS)
    assert load_settings({}).secret_values() == ()


def test_the_next_issue_settings_are_plain_optional_strings() -> None:
    assert (load_settings({}).clerk_secret_key, load_settings({}).ops_password, load_settings({}).metrics_token) == (
        None,
        None,
        None,
    )
    settings = load_settings({"CLERK_SECRET_KEY": "sk_x", "OPS_PASSWORD": "twelve-chars", "METRICS_TOKEN": "tok"})
    assert (settings.clerk_secret_key, settings.ops_password, settings.metrics_token) == (
        "sk_x",
        "twelve-chars",
        "tok",
    )


def test_a_short_ops_password_stops_the_start_without_showing_it() -> None:
    with pytest.raises(SettingsError) as excinfo:
        load_settings({"OPS_PASSWORD": "hunter2-pw"})
    assert "hunter2" not in str(excinfo.value)
    assert "OPS_PASSWORD" in str(excinfo.value)


def test_a_password_given_as_a_url_parameter_is_a_secret() -> None:
    settings = load_settings(
        {
            "DATABASE_URL": "postgresql+asyncpg://app@db:5432/app?password=db-query-pass&ssl=require",
            "REDIS_URL": "redis://redis:6379/0?password=redis%2Bquery+pass",
        }
    )
    assert set(settings.secret_values()) >= {
        "db-query-pass",
        "redis%2Bquery+pass",
        "redis+query+pass",
        "redis+query pass",
    }
    shown = repr(settings)
    assert "query" not in shown
    assert "database_url='postgresql+asyncpg://app@db:5432/app?password=***&ssl=require'" in shown
    assert "redis_url='redis://redis:6379/0?password=***'" in shown


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({"DATABASE_URL": "postgresql+asyncpg://u@host:notaport/db?password=hunter2pw"}, "DATABASE_URL"),
        ({"REDIS_URL": "localhost:6379/0?password=hunter2pw"}, "REDIS_URL"),
    ],
)
def test_a_url_error_shows_a_query_password_as_stars(env: dict[str, str], name: str) -> None:
    with pytest.raises(SettingsError) as excinfo:
        load_settings(env)
    assert str(excinfo.value).startswith(name)
    assert "hunter2pw" not in str(excinfo.value)
    assert "password=***" in str(excinfo.value)


def test_secrets_too_short_to_scrub_are_named() -> None:
    settings = load_settings(
        {
            "STRIPE_API_KEY": "sk_1",
            "METRICS_TOKEN": "long-enough-token",
            "DATABASE_URL": "postgresql+asyncpg://u:pw@db/app",
            "REDIS_URL": "redis://redis:6379/0?password=abc",
        }
    )
    assert settings.secrets_too_short_to_scrub() == ("DATABASE_URL", "REDIS_URL", "STRIPE_API_KEY")
    assert load_settings({"STRIPE_API_KEY": "sk_live_long"}).secrets_too_short_to_scrub() == ()


def test_each_secret_too_short_to_scrub_is_warned_about_once_at_start_by_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = {"APP_ENV": "test", "STRIPE_API_KEY": "sk_9z", "CLERK_SECRET_KEY": "sk_clerk_long_enough"}
    configure_logging(load_settings(env))
    try:
        output = capsys.readouterr().err
    finally:
        configure_logging(load_settings({"APP_ENV": "test"}))
    warnings = [line for line in output.splitlines() if "too short" in line]
    assert len(warnings) == 1, output
    assert "STRIPE_API_KEY" in warnings[0] and "warning" in warnings[0]
    assert "sk_9z" not in output


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql+asyncpg://u:hunter2pw@host:notaport/db", "postgresql+asyncpg://u:***@host:notaport/db"),
        ("redis://:pw@redis:6379/0", "redis://:***@redis:6379/0"),
        ("postgresql://u:p@ss:w/rd@host/db", "postgresql://u:***@host/db"),
        ("postgresql://u@host/db", "postgresql://u@host/db"),
        ("redis://redis:6379/0", "redis://redis:6379/0"),
        ("u:pw@host", "u:***@host"),
        ("not a url", "not a url"),
        ("postgresql://u@h/db?password=s3cr%40t+x&ssl=1", "postgresql://u@h/db?password=***&ssl=1"),
        ("redis://h:6379/0?password=p@ss", "redis://h:6379/0?password=***"),
        ("postgresql://u:pw1@h/db?ssl=1&PASSWORD=pw2#x", "postgresql://u:***@h/db?ssl=1&PASSWORD=***#x"),
        ("redis://h:6379/0?password=", "redis://h:6379/0?password="),
    ],
)
def test_redact_url_hides_the_password_even_of_a_url_that_does_not_parse(url: str, shown: str) -> None:
    assert redact_url(url) == shown
