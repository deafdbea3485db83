"""Start-up failures become one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from app.core.settings import SettingsError

EXIT_CONFIG = 2


@contextmanager
def exit_on_settings_error() -> Iterator[None]:
    try:
        yield
    except SettingsError as exc:
        print(f"Configuration error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_CONFIG) from None
