"""Test-only: counts each webhook handler's commit, loaded into the soak's workers with
``python -m app.worker --module bench.soak.counters:MODULE``.

Importing it wraps the Stripe and Clerk handlers of the billing and identity
modules (the ones ``app/worker/modules.py`` lists) so that each run of a
handler also inserts one row into ``soak_handler_commit``, in the handler's
own transaction: the row commits exactly when the handler's writes and the
event's ``processed_at`` commit, and rolls back with them. An event whose
effect was applied twice therefore has two rows. The table has no unique
constraint on purpose: one would turn a second application into a failed,
retried attempt and hide it.
"""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import text

from app.billing import module as billing
from app.core.module import FeatureModule
from app.identity import module as identity
from app.webhooks.handlers import WebhookContext, WebhookHandler

TABLE_DDL = """
CREATE TABLE IF NOT EXISTS soak_handler_commit (
    id bigserial PRIMARY KEY,
    provider text NOT NULL,
    event_id text NOT NULL,
    row_id bigint NOT NULL,
    worker_pid integer NOT NULL,
    committed_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
_RECORD = text(
    "INSERT INTO soak_handler_commit (provider, event_id, row_id, worker_pid) VALUES (:provider, :event_id, :row, :pid)"
)


def counting(handler: WebhookHandler) -> WebhookHandler:
    async def counted(context: WebhookContext) -> None:
        await handler(context)
        event = context.event
        values: dict[str, Any] = {"provider": event.provider, "event_id": event.event_id, "row": event.id}
        await context.session.execute(_RECORD, {**values, "pid": os.getpid()})

    counted.__wrapped__ = handler  # type: ignore[attr-defined]
    return counted


def _install() -> None:
    for module in (billing.MODULE, identity.MODULE):
        handlers: Any = module.webhook_handlers
        for provider, handler in list(handlers.items()):
            if not hasattr(handler, "__wrapped__"):
                handlers[provider] = counting(handler)


_install()
MODULE = FeatureModule(name="soak-counters")
