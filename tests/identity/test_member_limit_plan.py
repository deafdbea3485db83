"""The member limit's statement reads only the members it may change: a bulk import costs the same per member
whatever the organization's size (ranking every member on each event made a 20,000-member import O(n^2))."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from app.core.db import driver_connection
from app.core.resources import Resources
from app.identity.repository.workspaces import apply_member_limit_statement

MEMBERS = 5000


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


@pytest.mark.parametrize("analyzed", [False, True], ids=["fresh-table", "analyzed"])
async def test_applying_the_limit_after_one_more_member_reads_a_handful_of_rows(
    resources: Resources, analyzed: bool
) -> None:
    """5,000 members, 3 seats, every member past them suspended; one more joins: the statement suspends them and
    reads the 3 seat holders, the newcomer and no more."""
    async with driver_connection(resources.db) as connection:
        workspace = await connection.fetchval(
            "INSERT INTO workspace (clerk_org_id, name, member_limit) VALUES ('org_big', 'Big', 3) RETURNING id"
        )
        await connection.execute(
            "INSERT INTO app_user (clerk_user_id) SELECT 'user_' || g FROM generate_series(1, $1::int + 1) AS g",
            MEMBERS,
        )
        await connection.execute(
            "INSERT INTO workspace_member (clerk_membership_id, workspace_id, user_id, created_at, suspended_at) "
            "SELECT 'mem_' || u.id, $1, u.id, now() - make_interval(secs => 100000 - u.id), "
            "CASE WHEN u.id > 3 THEN now() END FROM app_user u WHERE u.id <= $2",
            workspace,
            MEMBERS,
        )
        await connection.execute(
            "INSERT INTO workspace_member (clerk_membership_id, workspace_id, user_id) "
            "SELECT 'mem_new', $1, max(id) FROM app_user",
            workspace,
        )
        if analyzed:
            await connection.execute("ANALYZE workspace_member")
        async with connection.transaction():
            statement = (
                str(apply_member_limit_statement())
                .replace(":workspace_id", "$1")
                .replace(":journal_source", "$2::text")
            )
            (row,) = await connection.fetch(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", workspace, "test")
            suspended = await connection.fetchval(
                "SELECT count(*) FROM workspace_member WHERE suspended_at IS NOT NULL AND workspace_id = $1", workspace
            )
    explained = json.loads(row[0]) if isinstance(row[0], str) else row[0]
    plan = explained[0]["Plan"]
    scans = [node for node in _nodes(plan) if node.get("Relation Name") == "workspace_member"]
    removed = ("Rows Removed by Filter", "Rows Removed by Index Recheck")
    read = sum(node["Actual Rows"] + sum(node.get(key, 0) for key in removed) for node in scans)
    assert suspended == MEMBERS - 3 + 1  # the newcomer too: the workspace is full
    assert all(node["Node Type"] != "Seq Scan" for node in scans), plan
    assert read <= 10, plan  # the 3 seat holders and the newcomer, not 5,001 members
