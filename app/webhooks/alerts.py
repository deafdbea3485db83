"""The one alert of an event set aside: an error log line and one Sentry message (no exception)."""

from __future__ import annotations

import logging
from typing import Any

from app.core.commands import plural
from app.core.metrics import EVENTS_SET_ASIDE, child
from app.core.sentry import report_message

logger = logging.getLogger(__name__)


def alert_set_aside(row: Any) -> None:
    """``row`` names the provider, event id, type, attempts and last error of the event set aside."""
    message = (
        f"Webhook event set aside after {plural(row['attempts'], 'attempt')}: provider={row['provider']} "
        f"event_id={row['event_id']} type={row['type']} last_error={row['last_error']!r}. "
        "Fix the cause, then run `make retry-abandoned` (or resend it from the provider's dashboard)."
    )
    logger.error(message)
    child(EVENTS_SET_ASIDE, row["provider"]).inc()
    report_message(
        message,
        level="error",
        tags={"webhook.provider": row["provider"], "webhook.type": row["type"]},
        extras={"event_id": row["event_id"], "attempts": row["attempts"], "last_error": row["last_error"]},
        fingerprint=["webhook-set-aside", row["provider"], row["event_id"]],
    )
