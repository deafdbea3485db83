"""``python -m bench.without_metrics MODULE [ARGS...]``: run ``python -m MODULE ARGS...`` with every count a no-op.

The reference of the ``metrics_cost`` phase: the same API or worker process
with the product's counters and histograms (``app.core.metrics``) replaced,
before anything imports them, by objects that do nothing. The product has no
such switch (its metrics are always on); this exists only to measure them.
"""

from __future__ import annotations

import runpy
import sys
from typing import Any


class _Nothing:
    """Stands for a metric, or for a labelled child of one: every call does nothing and returns it."""

    def __getattr__(self, _: str) -> Any:
        return self

    def __call__(self, *_: Any, **__: Any) -> Any:
        return self


def switch_off() -> None:
    from prometheus_client.metrics import MetricWrapperBase

    from app.core import metrics

    nothing = _Nothing()
    for name, value in vars(metrics).copy().items():
        if isinstance(value, MetricWrapperBase):
            setattr(metrics, name, nothing)
    metrics.child = nothing  # type: ignore[assignment]


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m bench.without_metrics MODULE [ARGS...]")
    switch_off()
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
