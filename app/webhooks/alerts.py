"""The one alert of an event set aside: an error log line and one Sentry message (no exception)."""

from __future__ import annotations

import logging

from app.core.commands import plural
from app.core.metrics import EVENTS_SET_ASIDE, child
from app.core.sentry import report_message
from app.webhooks.inbox import SetAside

logger = logging.getLogger(__name__)


def alert_set_aside(event: SetAside) -> None:
    message = (
        f"Webhook event set aside after {plural(event.attempts, 'attempt')}: provider={event.provider} "
        f"event_id={event.event_id} type={event.type} last_error={event.last_error!r}. "
        "Fix the cause, then run `make retry-abandoned` (or resend it from the provider's dashboard)."
    )
    logger.error(message)
    child(EVENTS_SET_ASIDE, event.provider).inc()
    report_message(
        message,
        level="error",
        tags={"webhook.provider": event.provider, "webhook.type": event.type},
        extras={"event_id": event.event_id, "attempts": event.attempts, "last_error": event.last_error},
        fingerprint=["webhook-set-aside", event.provider, event.event_id],
    )
