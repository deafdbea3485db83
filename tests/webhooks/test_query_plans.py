"""Row-targeted inbox statements find their row by key, never by scanning a partial index of many rows.

Without fresh statistics (a new table, autovacuum behind or off) Postgres chose the
partial index of pending rows for the claim and read every pending row per claim:
a backlog of N events cost O(N) per event. These plans guard against that shape.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.core.db import driver_connection
from app.core.resources import Resources
from app.webhooks.inbox.sql import CLAIM as _CLAIM
from app.webhooks.inbox.sql import SET_ASIDE_EXHAUSTED as _SET_ASIDE
from app.webhooks.inbox.sql import STORE as _STORE

ROWS = 3000


async def _plan(connection: Any, statement: str, *args: Any) -> str:
    """The plan Postgres uses for the prepared statement once it settles on a generic plan."""
    await connection.execute("SET plan_cache_mode = force_generic_plan")
    try:
        rows = await connection.fetch(f"EXPLAIN {statement}", *args)
    finally:
        await connection.execute("RESET plan_cache_mode")
    return "\n".join(row[0] for row in rows)


async def _fill(connection: Any, *, abandoned: bool) -> None:
    await connection.execute(
        "INSERT INTO webhook_event (provider, event_id, type, payload, attempts, abandoned_at) "
        "SELECT 'stripe', 'evt_plan_' || g, 'invoice.paid', '{}'::jsonb, 0, "
        "CASE WHEN $1 THEN now() END FROM generate_series(1, $2::int) AS g",
        abandoned,
        ROWS,
    )


@pytest.mark.parametrize(
    ("statement", "args"),
    [(_CLAIM, (ROWS // 2, 1, "30s")), (_SET_ASIDE, ([ROWS // 2], 1))],
    ids=["claim", "set-aside"],
)
async def test_statements_on_one_pending_row_use_the_primary_key(
    resources: Resources, statement: str, args: tuple[Any, ...]
) -> None:
    async with driver_connection(resources.db) as connection:
        await _fill(connection, abandoned=False)
        plan = await _plan(connection, statement, *args)
    assert "pk_webhook_event" in plan and "ix_webhook_event_pending" not in plan, plan


async def test_storing_a_redelivery_uses_the_unique_key_not_the_set_aside_rows(resources: Resources) -> None:
    async with driver_connection(resources.db) as connection:
        await _fill(connection, abandoned=True)
        plan = await _plan(connection, _STORE, "stripe", "evt_plan_7", "invoice.paid", "{}", None, None, None, None)
    assert "uq_webhook_event_provider_event_id" in plan and "ix_webhook_event_abandoned" not in plan, plan
