"""What the worker's entry points import first: advanced-alchemy, without the Litestar it would load.

advanced-alchemy imports Litestar (for the type of Litestar's DTO data)
whenever Litestar is installed, and with it all of Litestar: the app, the
OpenAPI document, its plugins, about a third of a worker's start-up (0.7 of
2.4 s of CPU) in a process that serves no request. It takes Litestar for not
installed when importing it fails, so the worker imports advanced-alchemy
first with Litestar out of reach (Python refuses a module whose
``sys.modules`` entry is None), then puts it back within reach: a module of
yours that needs Litestar in the worker still imports it. No module of the
project does (``tests/queue/test_worker_imports.py``); under ``litestar worker
run`` the CLI, which is Litestar's, has loaded it already and nothing changes.
"""

from __future__ import annotations

import importlib
import sys

LITESTAR = "litestar"


def load_advanced_alchemy_without_litestar() -> None:
    """Import advanced-alchemy as if Litestar were not installed; a no-op once either is loaded."""
    if LITESTAR in sys.modules or "advanced_alchemy" in sys.modules:
        return
    sys.modules[LITESTAR] = None  # type: ignore[assignment]
    try:
        importlib.import_module("advanced_alchemy")
    finally:
        del sys.modules[LITESTAR]
