"""Test-only: counts each application of an event, loaded into the soak's workers with
``python -m app.testing.worker --module bench.soak.counters:MODULE``.

Importing it wraps identity's Clerk handler so that each run of it also
inserts one row into ``soak_handler_commit``, in the handler's own
transaction: the row commits exactly when the handler's writes and the
event's ``processed_at`` commit, and rolls back with them. A Stripe event is
applied by the sync that covers it, which marks it processed in the
transaction that writes what it read: a trigger (``TABLE_DDL``) inserts its
row when that sets ``processed_at``. An event whose effect was applied twice
therefore has two rows. The table has no unique constraint on purpose: one
would turn a second application into a failed, retried attempt and hide it.
"""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import text

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
);
CREATE OR REPLACE FUNCTION soak_count_sync() RETURNS trigger AS $$
BEGIN
    INSERT INTO soak_handler_commit (provider, event_id, row_id, worker_pid)
    VALUES (NEW.provider, NEW.event_id, NEW.id, pg_backend_pid());
    RETURN NEW;
END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS soak_count_sync ON webhook_event;
CREATE TRIGGER soak_count_sync AFTER UPDATE OF processed_at ON webhook_event
    FOR EACH ROW WHEN (OLD.processed_at IS NULL AND NEW.processed_at IS NOT NULL AND NEW.provider = 'stripe')
    EXECUTE FUNCTION soak_count_sync();
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
    handlers: Any = identity.MODULE.webhook_handlers
    for provider, handler in list(handlers.items()):
        if not hasattr(handler, "__wrapped__"):
            handlers[provider] = counting(handler)


_install()
MODULE = FeatureModule(name="soak-counters")
