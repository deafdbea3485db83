"""A worker for tests: ``python -m app.testing.worker --module tests.my_jobs:MODULE [--fake-clock-file F] ...``.

The production worker (``python -m app.worker``) loads the modules of
``app/runtime.py`` and reads the system clock. Tests (yours, and the
project's, the bench's and the soak's) start this one instead: the same
worker, with their own feature modules loaded beside those, and optionally a
clock read from a file the test writes (``FileClock``), so cron ticks can be
made to happen at will.
"""

from __future__ import annotations

import argparse
import sys

from app.worker.startup_imports import load_advanced_alchemy_without_litestar

load_advanced_alchemy_without_litestar()  # as ``python -m app.worker`` does, before anything imports it

from app.core.module import FeatureModule, import_object  # noqa: E402
from app.testing.clock import FileClock  # noqa: E402
from app.worker.cli import run_worker  # noqa: E402


def load_module(path: str) -> FeatureModule:
    """``package.module:NAME`` (``NAME`` defaults to ``MODULE``) to the feature module it names."""
    module_path, _, attribute = path.partition(":")
    path = f"{module_path}:{attribute or 'MODULE'}"
    try:
        return import_object(path, FeatureModule, "--module")
    except (ImportError, TypeError) as exc:
        raise SystemExit(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.testing.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--module", action="append", default=[], metavar="PACKAGE.MODULE:NAME")
    parser.add_argument("--fake-clock-file", metavar="PATH", help="the cron scheduler's time (ISO 8601, UTC)")
    parser.add_argument("--queues", default="")
    parser.add_argument("--burst", action="store_true")
    args = parser.parse_args(argv)
    clock = FileClock(args.fake_clock_file) if args.fake_clock_file else None
    return run_worker(args.queues, args.burst, extra_modules=[load_module(path) for path in args.module], clock=clock)


if __name__ == "__main__":
    sys.exit(main())
