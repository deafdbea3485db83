"""Run one command against the development services: ``python -m tools.dev_env -- CMD ...``.

`make api`, `make worker`, `make migrate`, `make cli` and the operator targets
go through this: unset ``DATABASE_URL``/``REDIS_URL`` point at the embedded
servers under ``.data/`` (``DEV_DATA_DIR`` instead, for tests), started if
needed and left running for the next command; one line each on stderr says
which it started or found running, and how to stop them (``python -m
tools.embedded down``). The secrets `make dev` generated are loaded if
present. Only `make dev` generates secrets (docs/configuration.md).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

from tools import embedded
from tools.dev import RUNNING, SECRETS_FILE, SERVICES, use_local_stripe

DATA_DIR = embedded.DEFAULT_DATA_DIR
STOP_HINT = "`.venv/bin/python -m tools.embedded down` stops it"


def _load_existing_secrets(path: Path) -> None:
    if not path.exists():
        return
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.lstrip().startswith("#"):
            os.environ.setdefault(key.strip(), value.strip())


def main(argv: list[str]) -> int:
    command = argv[argv.index("--") + 1 :] if "--" in argv else argv
    if not command:
        print("usage: python -m tools.dev_env -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    data_dir = Path(os.environ.get("DEV_DATA_DIR") or DATA_DIR).resolve()
    _load_existing_secrets(data_dir / SECRETS_FILE)
    use_local_stripe()  # as `make dev` does: the worker of `make worker` reads what `make dev`'s would
    provide_embedded(data_dir)
    os.execvp(command[0], command)


def provide_embedded(data_dir: Path) -> None:
    """Point each unset URL at its embedded server, saying whether this command started it; both stay running."""
    for label, (var, ensure) in SERVICES.items():
        if os.environ.get(var):
            continue
        running = RUNNING[label](data_dir) is not None
        os.environ[var] = ensure(data_dir)
        port = urlsplit(os.environ[var]).port
        how = "running already" if running else "started now"
        print(f"{label}: embedded at 127.0.0.1:{port} ({how}, left running: {STOP_HINT}).", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
