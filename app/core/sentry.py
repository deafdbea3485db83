"""Sentry set-up and the one way our code reports to it: the only module that imports ``sentry_sdk``.

Reporting never raises: an alert that cannot be sent is logged and the code
that raised it goes on (docs/operations.md, Sentry).

Secrets and personal data stay home (docs/operations.md): no frame locals, no
request bodies, no auto-enabled integrations (Litestar's parsed every request
body before our handler, answering a malformed one with a 500), and every
event and breadcrumb is scrubbed of the values ``Settings.secret_values`` names.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol, cast

import sentry_sdk
from sentry_sdk.crons import capture_checkin as sentry_capture_checkin
from sentry_sdk.integrations.logging import LoggingIntegration
from sentry_sdk.integrations.logging import ignore_logger as sentry_ignore_logger
from sentry_sdk.types import Breadcrumb, BreadcrumbHint, Event, Hint, MonitorConfig

from app.core.redaction import SENSITIVE_HEADERS, SecretScrubber
from app.core.request_context import current_request_id
from app.core.tracing import current_trace_id

logger = logging.getLogger(__name__)
Component = Literal["api", "worker", "cli"]


class SentrySettings(Protocol):
    """What Sentry's set-up reads of the settings (a protocol: the settings module itself uses this one)."""

    @property
    def sentry_dsn(self) -> str | None: ...
    @property
    def app_env(self) -> str: ...
    def secret_values(self) -> tuple[str, ...]: ...


def init_sentry(settings: SentrySettings, component: Component) -> bool:
    """Start Sentry when ``SENTRY_DSN`` is set; returns whether it is on."""
    if not settings.sentry_dsn:
        return False
    scrubber = SecretScrubber(settings.secret_values())
    sentry_sdk.init(
        dsn=settings.sentry_dsn,
        environment=settings.app_env,
        # Error log lines stay breadcrumbs: faults are reported explicitly (report_exception /
        # report_message), so each reaches Sentry exactly once.
        integrations=[LoggingIntegration(event_level=None)],
        auto_enabling_integrations=False,
        include_local_variables=False,
        max_request_body_size="never",
        # send_default_pii stays unset, which is off: setting it, even to False, is deprecated in
        # favour of data_collection, and setting that would drop the SDK's own key-name scrubber.
        before_send=_event_scrubber(scrubber),
        before_breadcrumb=_breadcrumb_scrubber(scrubber),
        traces_sample_rate=0.0,
        server_name=None,
    )
    sentry_sdk.set_tag("component", component)
    return True


def _event_scrubber(scrubber: SecretScrubber) -> Callable[[Event, Hint], Event | None]:
    def before_send(event: Event, hint: Hint) -> Event | None:
        _drop_request_payload(event)
        return cast(Event, scrubber.deep(event)) if scrubber else event

    return before_send


def _breadcrumb_scrubber(scrubber: SecretScrubber) -> Callable[[Breadcrumb, BreadcrumbHint], Breadcrumb | None]:
    def before_breadcrumb(crumb: Breadcrumb, hint: BreadcrumbHint) -> Breadcrumb | None:
        return cast(Breadcrumb, scrubber.deep(crumb)) if scrubber else crumb

    return before_breadcrumb


def _drop_request_payload(event: Event) -> None:
    """No integration of ours attaches a request; should one ever, its body and credentials stay out."""
    request = event.get("request")
    if not isinstance(request, dict):
        return
    request.pop("data", None)
    request.pop("cookies", None)
    headers = request.get("headers")
    if isinstance(headers, dict):
        request["headers"] = {key: value for key, value in headers.items() if key.lower() not in SENSITIVE_HEADERS}


def ignore_logger(name: str) -> None:
    """Sentry takes nothing from this logger (not even breadcrumbs): its failures are reported explicitly."""
    sentry_ignore_logger(name)


def capture_checkin(
    slug: str,
    status: str,
    *,
    check_in_id: str | None = None,
    duration: float | None = None,
    monitor_config: Mapping[str, Any] | None = None,
) -> str | None:
    """A cron monitor check-in; returns its id, or None when it could not be sent (never raises)."""
    try:
        return sentry_capture_checkin(
            monitor_slug=slug,
            check_in_id=check_in_id,
            status=status,
            duration=duration,
            monitor_config=cast(MonitorConfig | None, monitor_config),
        )
    except Exception:  # a check-in that cannot be sent never fails the cron
        logger.warning("Could not send a Sentry check-in for cron %s", slug, exc_info=True)
        return None


def _correlation() -> dict[str, str]:
    """The request the failing code runs for (a delivery, or the request that queued the job) and the trace it is
    part of (tracing on), as tags."""
    tags = {"request_id": current_request_id(), "trace_id": current_trace_id()}
    return {key: value for key, value in tags.items() if value}


def report_exception(
    exc: BaseException, *, tags: Mapping[str, Any] | None = None, fingerprint: list[str] | None = None
) -> None:
    try:
        with sentry_sdk.new_scope() as scope:
            for key, value in {**_correlation(), **(tags or {})}.items():
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
