"""Each scrape of the API's ``/metrics`` counts the inbox's unprocessed rows: it must read only those, through the
partial indexes of pending and set-aside rows, however many processed rows the table holds (a day of them at
scale is hundreds of thousands: reading them every scrape is what this guards against)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from app.core.db import driver_connection
from app.core.resources import Resources
from app.webhooks.inbox import Inbox
from app.webhooks.inbox.sql import NO_TABLE_SCAN, QUEUE_TENANTS, UNPROCESSED_COUNTS

PROCESSED = 20_000
PENDING, FAILED, SET_ASIDE = 30, 10, 5


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


async def _fill(connection: Any) -> None:
    """Processed rows of the last hours (the ones a 24 h count reads), and a few unprocessed ones."""
    await connection.execute(
        "INSERT INTO webhook_event (provider, event_id, type, payload, attempts, received_at, processed_at) "
        "SELECT 'stripe', 'evt_done_' || g, 'invoice.paid', '{}'::jsonb, 1, now() - interval '2 hours', "
        "now() - interval '1 hour' FROM generate_series(1, $1::int) AS g",
        PROCESSED,
    )
    await connection.execute(
        "INSERT INTO webhook_event (provider, event_id, type, payload, attempts, abandoned_at) "
        "SELECT CASE WHEN g % 2 = 0 THEN 'stripe' ELSE 'clerk' END, 'evt_open_' || g, 'invoice.paid', '{}'::jsonb, "
        "CASE WHEN g <= $1::int THEN 0 WHEN g <= $1::int + $2::int THEN 2 ELSE 33 END, "
        "CASE WHEN g > $1::int + $2::int THEN now() END FROM generate_series(1, $1::int + $2::int + $3::int) AS g",
        PENDING,
        FAILED,
        SET_ASIDE,
    )


# The partial indexes of unprocessed rows (not set aside): either serves the pending and failed counts.
UNPROCESSED_INDEXES = {"ix_webhook_event_pending", "ix_webhook_event_tenant"}


@pytest.mark.parametrize("analyzed", [False, True], ids=["fresh-table", "analyzed"])
@pytest.mark.parametrize(
    ("statement", "set_aside_read"), [(UNPROCESSED_COUNTS, True), (QUEUE_TENANTS, False)], ids=["counts", "tenants"]
)
async def test_the_scrape_reads_only_the_unprocessed_rows_through_the_partial_indexes(
    resources: Resources, analyzed: bool, statement: str, set_aside_read: bool
) -> None:
    async with driver_connection(resources.db) as connection:
        await _fill(connection)
        if analyzed:
            await connection.execute("ANALYZE webhook_event")
        async with connection.transaction():  # as Inbox.unprocessed_counts and queue_tenants run it
            await connection.execute(NO_TABLE_SCAN)
            (row,) = await connection.fetch(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}")
    explained = json.loads(row[0]) if isinstance(row[0], str) else row[0]  # the pool's connections decode json
    plan = explained[0]["Plan"]
    nodes = list(_nodes(plan))
    scans = [node for node in nodes if node.get("Relation Name") == "webhook_event"]  # index or bitmap heap scans

    indexes = {node["Index Name"] for node in nodes if "Index Name" in node}
    assert indexes - {"ix_webhook_event_abandoned"} <= UNPROCESSED_INDEXES, plan
    assert ("ix_webhook_event_abandoned" in indexes) == set_aside_read, plan
    assert all(node["Node Type"] != "Seq Scan" for node in scans), plan
    removed = ("Rows Removed by Filter", "Rows Removed by Index Recheck")
    read = sum(node["Actual Rows"] + sum(node.get(key, 0) for key in removed) for node in scans)
    assert read == PENDING + FAILED + (SET_ASIDE if set_aside_read else 0), plan


async def test_the_counts_split_per_provider_and_state(resources: Resources) -> None:
    async with driver_connection(resources.db) as connection:
        await _fill(connection)
    inbox = Inbox(resources.db)

    counts = await inbox.unprocessed_counts()

    assert counts == {
        "stripe": {"pending": PENDING // 2, "failed": FAILED // 2, "set_aside": 2},
        "clerk": {"pending": PENDING // 2, "failed": FAILED // 2, "set_aside": 3},
    }
    assert await inbox.processed_last_day() == {"stripe": PROCESSED}
