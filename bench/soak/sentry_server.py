"""The soak's Sentry: ``tests/stubs/sentry_ingest.py`` in its own process, every event appended to a file.

    python -m bench.soak.sentry_server --out events.jsonl    # prints "ready <dsn>"

Each line: ``{"level", "message", "exceptions": [types], "extra": {...}, "tags": {...}}``. The driver
reads the file when it checks that each set-aside event got exactly one alert.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
from pathlib import Path
from typing import Any

from tests.stubs.sentry_ingest import SentryIngestStub, exception_types


class _FileSentry(SentryIngestStub):
    def __init__(self, out: Path) -> None:
        super().__init__()
        self._out = out.open("a", buffering=1)
        self._serial = threading.Lock()  # one envelope at a time: the parent parses into a shared list

    def _ingest(self, body: bytes) -> None:
        with self._serial:
            super()._ingest(body)
            with self._lock:
                new = list(self.events)
                self.events.clear()  # the file is the record: memory stays flat over a long run
            for event in new:
                self._write(event)

    def _write(self, event: dict[str, Any]) -> None:
        message = event.get("message")
        if isinstance(message, dict):
            message = message.get("formatted") or message.get("message")
        if message is None and isinstance(event.get("logentry"), dict):
            message = event["logentry"].get("formatted") or event["logentry"].get("message")
        record = {
            "level": event.get("level"),
            "message": message,
            "exceptions": exception_types(event),
            "extra": event.get("extra") or {},
            "tags": event.get("tags") or {},
        }
        self._out.write(json.dumps(record, default=str) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    stub = _FileSentry(args.out).start()
    print(f"ready {stub.dsn}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        threading.Event().wait()


if __name__ == "__main__":
    main()
