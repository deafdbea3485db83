"""The tiny email port the worked example sends through; swap the default for a real provider.

``EMAIL`` is the mail provider as an upstream: every send passes its rate
across the fleet and waits out its outages and pauses (docs/jobs.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from app.queue.upstreams import Upstream

logger = logging.getLogger(__name__)

EMAIL = Upstream("email", per_second=10)
"""The mail provider: at most 10 sends a second across the fleet (set it to your provider's limit)."""


@dataclass(frozen=True)
class EmailMessage:
    to: tuple[str, ...]
    subject: str
    body: str


class EmailSender(Protocol):
    async def send(self, message: EmailMessage) -> None:
        """Deliver or raise: a raised error means not sent (the job retries it)."""
        ...


class LoggingEmailSender:
    """The default: writes the email to the log instead of sending it (development, tests)."""

    async def send(self, message: EmailMessage) -> None:
        logger.info("Email to %s: %s", ", ".join(message.to), message.subject, extra={"email_subject": message.subject})
