"""A Litestar app served on loopback from a thread: what the provider API stubs run on.

Tests talk to it over real HTTP with the real SDKs, so only the server is fake.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Self

import uvicorn
from litestar import Litestar

# Quiet and without lifespan; stop() sets force_exit, so requests sleeping in a `slow` fault do not delay it.
_SERVER_OPTIONS: dict[str, Any] = {"loop": "asyncio", "lifespan": "off", "log_level": "warning", "access_log": False}


class LoopbackServer:
    """Subclasses build the app (``_build_app``); ``start()`` serves it until ``stop()`` (or as a context manager)."""

    name = "stub"

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._host, self._port = host, port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def _build_app(self) -> Litestar:
        raise NotImplementedError

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError(f"{type(self).__name__} is not running: call start() or use it as a context manager")
        return f"http://{self._host}:{self._port}"

    def start(self) -> Self:
        """Binds first (port 0 picks a free one), so the URL is known before serving begins."""
        # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only then; proto 0 adds ~40 ms (Nagle) per answer.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, self._port))
        self._port = sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(self._build_app(), **_SERVER_OPTIONS))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name=self.name, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{type(self).__name__} failed to start on {self._host}:{self._port}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stops serving at once; requests still sleeping are cut off."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = self._server.force_exit = True
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_exc_info: object) -> None:
        self.stop()
