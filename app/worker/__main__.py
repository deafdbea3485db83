"""``python -m app.worker [--queues a,b]``: the worker, as ``litestar worker run``."""

from app.worker.startup_imports import load_advanced_alchemy_without_litestar

load_advanced_alchemy_without_litestar()

from app.worker.cli import run_command  # noqa: E402  (after advanced-alchemy: app/worker/startup_imports.py)

run_command(prog_name="python -m app.worker")
