"""``python -m bench.from_tree DIR MODULE [ARGS...]``: run ``python -m MODULE ARGS...`` on the code of another checkout.

The reference a phase can measure a feature's "off" against: the product as it
was before the feature (``--baseline-tree DIR``, a ``git worktree`` of that
commit), started by the same fleet with the same settings, so both run side by
side in one run. ``DIR`` takes the place of this checkout on the import path;
the interpreter and its installed packages stay this one's.
"""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit("usage: python -m bench.from_tree DIR MODULE [ARGS...]")
    tree, module = os.path.abspath(sys.argv[1]), sys.argv[2]
    here = os.path.abspath(os.getcwd())
    sys.path[:] = [tree, *(entry for entry in sys.path if os.path.abspath(entry or ".") != here)]
    sys.argv = sys.argv[2:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
