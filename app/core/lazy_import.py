"""A module imported when first used rather than when named: for an SDK that many processes never call.

The Stripe SDK costs about 0.2 s of CPU to import (with its HTTP clients);
every worker and command loads the billing module, but only those that read
Stripe or verify a Stripe delivery use it. The standard library's
``importlib.util.LazyLoader`` recipe: the module object is in ``sys.modules`` at
once and runs its code on the first attribute read.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def lazy_module(name: str) -> ModuleType:
    """``name``, loaded on the first attribute read (the module itself if something imported it already)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ImportError(f"No module named {name!r}: install the project's dependencies (make install).")
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
