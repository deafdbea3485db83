"""An OTLP/HTTP endpoint on loopback that takes every export and keeps only its size: the tracing phase's backend.

It answers as a collector does (200, an empty ``ExportTraceServiceResponse``,
which is zero bytes) in a thread of the harness, so the measured processes pay
for encoding and sending their spans, and nothing else.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class OtlpSink:
    def __init__(self) -> None:
        self.exports = 0
        self.bytes = 0
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = len(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                with sink._lock:
                    sink.exports += 1
                    sink.bytes += size
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> OtlpSink:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
