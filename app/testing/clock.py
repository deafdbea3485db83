"""A clock a test moves by hand, read by the worker's cron scheduler (``python -m app.testing.worker``)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path


class FileClock:
    """The time is the ISO timestamp written in a file, so a test in another process moves it at will."""

    read_every_seconds = 0.05
    """A moved clock is seen within 50 ms: the test waits on the tick it made due."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def now(self) -> datetime:
        try:
            value = datetime.fromisoformat(self.path.read_text().strip())
        except (OSError, ValueError):
            return datetime.now(UTC)
        return value if value.tzinfo else value.replace(tzinfo=UTC)
