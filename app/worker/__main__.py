"""``python -m app.worker [--queues a,b]``: the worker, as ``litestar worker run``."""

from app.worker.cli import run_command

run_command(prog_name="python -m app.worker")
