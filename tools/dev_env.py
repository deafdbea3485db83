"""Run one command against the development services: ``python -m tools.dev_env -- CMD ...``.

`make api`, `make worker`, `make migrate` and the operator targets go through
this: unset ``DATABASE_URL``/``REDIS_URL`` point at the embedded servers under
``.data/`` (started if needed, left running for the next command; stop them
with ``python -m tools.embedded down``), and the secrets `make dev` generated
are loaded if present. Only `make dev` generates secrets (docs/configuration.md).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tools import embedded
from tools.dev import SECRETS_FILE, use_local_stripe

DATA_DIR = embedded.DEFAULT_DATA_DIR


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
    _load_existing_secrets(DATA_DIR / SECRETS_FILE)
    use_local_stripe()  # as `make dev` does: the worker of `make worker` reads what `make dev`'s would
    if not os.environ.get("DATABASE_URL"):
        os.environ["DATABASE_URL"] = embedded.ensure_postgres(DATA_DIR)
    if not os.environ.get("REDIS_URL"):
        os.environ["REDIS_URL"] = embedded.ensure_redis(DATA_DIR)
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
