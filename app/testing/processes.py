"""What tests and benchmarks need to run the app in real child processes: a free port, a clean environment."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


def free_port() -> int:
    """A loopback port no one listens on now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` on top of a minimal environment, so no developer setting leaks into the child."""
    base = {key: os.environ[key] for key in ("PATH", "HOME", "LANG") if key in os.environ}
    return {**base, "PYTHONUNBUFFERED": "1", **env}
