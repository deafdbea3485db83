"""``python -m bench.without_metrics MODULE [ARGS...]``: run ``python -m MODULE ARGS...`` with every count a no-op.

The reference of the ``metrics_cost`` phase: the same API or worker process
with the product's counters and histograms (``app.core.metrics``) replaced,
before anything imports them, by objects that do nothing. The product has no
such switch (its metrics are always on); this exists only to measure them.
"""

from __future__ import annotations

from typing import Any

from bench.switched import run_switched


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
    run_switched(switch_off, "python -m bench.without_metrics MODULE [ARGS...]")


if __name__ == "__main__":
    main()
