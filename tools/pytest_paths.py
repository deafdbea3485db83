"""A pytest plugin `make test` loads (``-p tools.pytest_paths``): a test path that does not exist is an error.

With pytest-xdist (``-n 2``) pytest's own "file or directory not found" is lost: the workers collect
nothing and the run ends with only "no tests ran". This checks the paths given on the command line
(``tests/x.py``, ``tests/x.py::test_y``, a folder) before any worker starts, and stops with a usage
error (exit code 4) naming each missing one.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def missing_paths(args: list[str], root: Path) -> list[str]:
    """The arguments whose file or folder (the part before ``::``) does not exist under ``root``."""
    return [arg for arg in args if not (root / arg.split("::", 1)[0]).exists()]


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or config.getoption("pyargs", False):
        return  # an xdist worker (the controller checked), or module names rather than paths
    missing = missing_paths(list(config.args), config.invocation_params.dir)
    if missing:
        raise pytest.UsageError(
            f"file or directory not found: {', '.join(missing)} (PYTEST_ARGS names tests by path, e.g. "
            "tests/webhooks or tests/webhooks/test_intake.py::test_name, relative to the project root)"
        )
