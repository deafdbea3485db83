"""Sentry set-up and the one way our code reports to it.

Reporting never raises: an alert that cannot be sent is logged and the code
that raised it goes on (SPEC section 7).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Literal

import sentry_sdk

from app.core.settings import Settings

logger = logging.getLogger(__name__)
Component = Literal["api", "worker", "cli"]


def init_sentry(settings: Settings, component: Component) -> bool:
    """Start Sentry when ``SENTRY_DSN`` is set; returns whether it is on."""
    if not settings.sentry_dsn:
        return False
    from sentry_sdk.integrations.logging import LoggingIntegration

    # Error log lines stay breadcrumbs: faults are reported explicitly (report_exception /
    # report_message) or by the Litestar integration, so each reaches Sentry exactly once.
    integrations: list[Any] = [LoggingIntegration(event_level=None)]
    if component == "api":
        from sentry_sdk.integrations.litestar import LitestarIntegration

        integrations.append(LitestarIntegration())
    sentry_sdk.init(
        dsn=settings.sentry_dsn,
        environment=settings.app_env,
        integrations=integrations,
        traces_sample_rate=0.0,
        server_name=None,
    )
    sentry_sdk.set_tag("component", component)
    return True


def report_exception(
    exc: BaseException, *, tags: Mapping[str, Any] | None = None, fingerprint: list[str] | None = None
) -> None:
    try:
        with sentry_sdk.new_scope() as scope:
            for key, value in (tags or {}).items():
                scope.set_tag(key, value)
            if fingerprint:
                scope.fingerprint = fingerprint
            scope.capture_exception(exc)
    except Exception:  # the report must never fail the caller
        logger.exception("Could not report an exception to Sentry; the error above is only in the logs.")


def report_message(
    message: str,
    *,
    level: Literal["error", "warning", "info"] = "error",
    tags: Mapping[str, Any] | None = None,
    extras: Mapping[str, Any] | None = None,
    fingerprint: list[str] | None = None,
) -> None:
    try:
        with sentry_sdk.new_scope() as scope:
            for key, value in (tags or {}).items():
                scope.set_tag(key, value)
            for key, value in (extras or {}).items():
                scope.set_extra(key, value)
            if fingerprint:
                scope.fingerprint = fingerprint
            scope.capture_message(message, level=level)
    except Exception:
        logger.exception("Could not send an alert to Sentry: %s", message)


def flush_sentry(timeout: float = 2.0) -> None:
    try:
        sentry_sdk.flush(timeout=timeout)
    except Exception:
        logger.warning("Sentry flush failed", exc_info=True)
