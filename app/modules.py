"""The feature modules the API mounts. The worker's list lives in ``app/worker/modules.py``."""

from __future__ import annotations

from app.core.module import FeatureModule


def api_modules() -> list[FeatureModule]:
    from app import billing, identity, system
    from app.webhooks.module import MODULE as webhooks

    return [system.MODULE, webhooks, billing.MODULE, identity.MODULE]
