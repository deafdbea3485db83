"""The pytest plugin `make test` loads (``-p tools.make_test``): missing test paths, and tests left out on request.

- A path given on the command line that does not exist is a usage error (exit code 4) naming it.
  With pytest-xdist (``-n 3``) pytest's own "file or directory not found" is lost: the workers
  collect nothing and the run ends with only "no tests ran". The paths are checked before any
  worker starts.
- ``--without-system-deps`` (``make test NO_SYSTEM_DEPS=1``) deselects the tests that need what
  ``make system-deps`` installs: those using the ``browser`` fixture (Debian's chromium), those of a
  module that runs Prometheus or promtool (Debian's prometheus), and those marked ``container`` (a
  container engine). pytest reports them as deselected.
- Quiet (``-q``) with xdist, its placeholder line ``bringing up nodes...`` is not printed: xdist writes
  it, when the output is not a terminal, once as the workers start and again once they have collected
  (at verbosity below 0 its status line has nothing else to say). pytest ``-q`` prints nothing before
  the first result; neither does ``make test`` now.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

BROWSER_FIXTURE = "browser"
CONTAINER_MARKER = "container"
_RUNS_PROMETHEUS = re.compile(r"""which\(\s*["'](prometheus|promtool)["']\s*\)""")


def missing_paths(args: list[str], root: Path) -> list[str]:
    """The arguments whose file or folder (the part before ``::``) does not exist under ``root``."""
    return [arg for arg in args if not (root / arg.split("::", 1)[0]).exists()]


@functools.cache
def runs_prometheus(module: Path) -> bool:
    try:
        return bool(_RUNS_PROMETHEUS.search(module.read_text(encoding="utf-8")))
    except OSError:
        return False


def needs_system_deps(item: pytest.Item) -> bool:
    return (
        BROWSER_FIXTURE in getattr(item, "fixturenames", ())
        or item.get_closest_marker(CONTAINER_MARKER) is not None
        or runs_prometheus(Path(item.path))
    )


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--without-system-deps",
        action="store_true",
        help="deselect the tests that need Debian's chromium or prometheus, or a container engine",
    )


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


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Before xdist's controller starts its workers (its own hook runs last)."""
    config = session.config
    status = config.pluginmanager.getplugin("terminaldistreporter")
    if status is not None and config.get_verbosity() < 0 and hasattr(status, "ensure_show_status"):
        status.ensure_show_status = lambda: None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("without_system_deps"):
        return
    deselected = [item for item in items if needs_system_deps(item)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if not needs_system_deps(item)]
