"""The feature modules the worker loads. A job of a module not listed here never runs."""

from __future__ import annotations

from app.core.module import FeatureModule


def worker_modules() -> list[FeatureModule]:
    return []
