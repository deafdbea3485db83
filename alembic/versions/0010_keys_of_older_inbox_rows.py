"""webhook_event rows stored before 0005: the tenant key and sync subject their handling module gives them

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04 10:00:00.000000

0005 added ``tenant_key`` and ``sync_subject`` without filling them, so a row
stored before it has neither: the processing worked a Stripe event's subject
out of its payload (a branch this migration retires), and no tenant's timeline
or fair turn found the row. Each such row gets the keys the intake stores
today, computed as the intake computes them: by the module that handles the
row's provider (``EventKeys``: billing's ``stripe_tenant`` and subjects,
identity's ``clerk_tenant``), from the stored payload decoded as the worker
decodes it.

Written in Python, reading the rows in batches by id, rather than in SQL: the
rules are Python (``route_for``'s longest prefix, ``stripe_id``'s checks, a thin
event's related object), and a second copy of them in jsonb operators could
drift from the first unnoticed. What the handling module's tables know of an
event (``SyncedEvents.known``) is not asked: an optimization only, and thin
events came after 0005.

The rows read are those without a tenant: every row stored before 0005, and
the few after it whose body names none (the same rules give them the same
nothing). A column already filled is kept. Rows of a provider no loaded module
handles, and bodies that cannot be decoded, are left as they are: their
processing sets them aside, as it did. Each batch commits on its own, so the
rows it fills are locked only briefly while the running release goes on
processing (a rerun after an interruption fills what is left). Offline
(``--sql``) it writes nothing: the rows are read in Python.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa

from alembic import context, op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

BATCH = 1000

_WITHOUT_TENANT = sa.text(
    "SELECT id, provider, type, payload::text AS payload FROM webhook_event "
    "WHERE tenant_key IS NULL AND id > :after ORDER BY id LIMIT :batch"
)
_FILL = sa.text(
    "UPDATE webhook_event AS e SET tenant_key = coalesce(e.tenant_key, k.tenant), "
    "sync_subject = coalesce(e.sync_subject, k.subject) "
    "FROM unnest(CAST(:ids AS bigint[]), CAST(:tenants AS text[]), CAST(:subjects AS text[])) "
    "AS k(id, tenant, subject) WHERE e.id = k.id"
)


def upgrade() -> None:
    if context.is_offline_mode():
        return
    from app.runtime import all_modules
    from app.webhooks.handlers import EventKeys, event_keys
    from app.webhooks.payload import PayloadError, decode_payload

    connection = op.get_bind()
    keys_of: dict[str, Callable[[str, Mapping[str, Any]], EventKeys]] = {}
    after = 0
    with op.get_context().autocommit_block():  # each batch commits on its own: its row locks are held briefly
        while True:
            rows = connection.execute(_WITHOUT_TENANT, {"after": after, "batch": BATCH}).all()
            fills: dict[str, list[Any]] = {"ids": [], "tenants": [], "subjects": []}
            for row in rows:
                if row.provider not in keys_of:
                    keys_of[row.provider] = event_keys(all_modules(), row.provider)
                try:
                    keys = keys_of[row.provider](row.type, decode_payload(row.payload))
                except PayloadError:
                    continue
                if keys != EventKeys():
                    fills["ids"].append(row.id)
                    fills["tenants"].append(keys.tenant)
                    fills["subjects"].append(keys.subject)
            if fills["ids"]:
                connection.execute(_FILL, fills)
            if len(rows) < BATCH:
                return
            after = rows[-1].id


def downgrade() -> None:
    """The keys stay: they are what the intake would have stored (0005's downgrade drops the columns)."""
