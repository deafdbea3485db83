"""The feature modules the worker loads. A job of a module not listed here never runs."""

from __future__ import annotations

from app.core.module import FeatureModule


def worker_modules() -> list[FeatureModule]:
    from app import billing, clients, identity
    from app.webhooks.module import MODULE as webhooks

    return [webhooks, clients.MODULE, billing.MODULE, identity.MODULE]
