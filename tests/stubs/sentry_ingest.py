"""A Sentry ingest stub: a real HTTP server on loopback that keeps every envelope it receives."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from tests.stubs.post_server import Answer, PostServer


class SentryIngestStub:
    """Point ``SENTRY_DSN`` at :attr:`dsn`; read what arrived from :attr:`events`.

    :attr:`envelopes` keeps every request body as sent (decompressed), so a test
    can look for a string anywhere in what left the process, items we do not parse included.
    """

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.envelopes: list[bytes] = []
        self.check_ins: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)  # notified on each envelope: wait_for wakes at once
        self._arrivals = 0
        self._server = PostServer(self._receive)

    def _receive(self, _: str, body: bytes) -> Answer:
        self._ingest(body)
        return 200, "application/json", b"{}"

    @property
    def dsn(self) -> str:
        return f"http://public@127.0.0.1:{self._server.port}/1"

    def start(self) -> SentryIngestStub:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def _ingest(self, body: bytes) -> None:
        with self._lock:
            self.envelopes.append(body)
            self._arrivals += 1
            self._arrived.notify_all()
        position = body.find(b"\n") + 1  # skip the envelope header
        while 0 < position < len(body):
            end = body.find(b"\n", position)
            header = json.loads(body[position : end if end >= 0 else len(body)] or b"{}")
            start = end + 1
            length = header.get("length")
            stop = start + length if length is not None else (body.find(b"\n", start) % (len(body) + 1))
            if stop < start:
                stop = len(body)
            payload, position = body[start:stop], stop + 1
            kind = header.get("type")
            if kind in ("event", "check_in"):
                item = json.loads(payload)
                with self._lock:
                    (self.events if kind == "event" else self.check_ins).append(item)
                    self._arrivals += 1
                    self._arrived.notify_all()

    def wait_for(
        self,
        predicate: Callable[[list[dict[str, Any]]], bool],
        timeout: float = 10.0,
        *,
        check_ins: bool = False,
    ) -> list[dict[str, Any]]:
        """Until ``predicate`` holds for what arrived (each arrival wakes it), or ``timeout``: what arrived then."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                items, arrivals = list(self.check_ins if check_ins else self.events), self._arrivals
            left = deadline - time.monotonic()
            if predicate(items) or left <= 0:
                return items
            with self._arrived:
                if self._arrivals == arrivals:
                    self._arrived.wait(left)

    def clear(self) -> None:
        with self._lock:
            self.events.clear()
            self.check_ins.clear()
            self.envelopes.clear()

    def sent_bytes(self) -> bytes:
        """Everything received so far, envelope headers included."""
        with self._lock:
            return b"\n".join(self.envelopes)


def exception_types(event: dict[str, Any]) -> list[str]:
    return [value.get("type", "") for value in event.get("exception", {}).get("values", [])]
