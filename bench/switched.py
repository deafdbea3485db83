"""Run ``python -m MODULE ARGS...`` after switching something off: the references some phases measure against."""

from __future__ import annotations

import runpy
import sys
from collections.abc import Callable


def run_switched(switch_off: Callable[[], None], usage: str) -> None:
    """``switch_off()`` before anything imports what it changes, then the module named by ``sys.argv[1]``."""
    if len(sys.argv) < 2:
        raise SystemExit(f"usage: {usage}")
    switch_off()
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
