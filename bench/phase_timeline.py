"""Phase timeline: a busy workspace's timeline page, in an inbox of a million rows.

Bulk-loaded with SQL (``generate_series``): an inbox of ``timeline_inbox_rows``
processed events, ``timeline_workspace_events`` of them its Stripe
customer's and Clerk organization's, spread through it; ``timeline_journal_rows``
journal rows of the workspace (half caused by its events, half by a job)
and as many of other workspaces. An API with the operations page is started,
an operator logs in, and ``GET /ops/workspaces/<id>`` (the newest page: 50
entries, what waits) is asked ``timeline_requests`` times after a few to warm
it up: p50 and p99 of the time to the whole page, as the client waits for it.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

import httpx

from bench.measures import percentile

if TYPE_CHECKING:
    from bench.harness import Run

OPS_PASSWORD = "bench-ops-password-7291"
WARM_UP_REQUESTS = 5
_CSRF = re.compile(r'name="_csrf" value="([^"]+)"')


async def timeline(run: Run) -> None:
    mode = run.mode
    await run.reset_inbox()
    started = time.perf_counter()
    workspace = await _load(run, mode.timeline_inbox_rows, mode.timeline_workspace_events, mode.timeline_journal_rows)
    run.log(
        f"  timeline: loaded {mode.timeline_inbox_rows} inbox rows ({mode.timeline_workspace_events} of the workspace) "
        f"and {2 * mode.timeline_journal_rows} journal rows in {time.perf_counter() - started:.1f} s"
    )
    url = await run.fleet.api(env={"OPS_PASSWORD": OPS_PASSWORD})  # the operations page on
    try:
        timings, entries = await _ask(url, f"/ops/workspaces/{workspace}", mode.timeline_requests)
    finally:
        await run.fleet.release_api()
    if entries != 50:
        run.notes.append(f"timeline: the page showed {entries} entries, not 50")
    run.results.update(
        timeline_p50_ms=percentile(timings, 0.5) * 1000,
        timeline_p99_ms=percentile(timings, 0.99) * 1000,
        timeline_requests=len(timings),
        timeline_inbox_rows=mode.timeline_inbox_rows,
        timeline_workspace_events=mode.timeline_workspace_events,
        timeline_journal_rows=mode.timeline_journal_rows,
    )
    run.log(
        f"  timeline: {len(timings)} pages, p50 {run.results['timeline_p50_ms']:.1f} ms, "
        f"p99 {run.results['timeline_p99_ms']:.1f} ms"
    )
    await run.pool.execute("TRUNCATE workspace_change")
    await run.reset_inbox()


async def _load(run: Run, inbox_rows: int, events: int, journal_rows: int) -> int:
    """The rows, as the intake and the handlers would have left them; the workspace's id."""
    workspace = await run.pool.fetchval(
        "INSERT INTO workspace (clerk_org_id, stripe_customer_id, name, member_limit) "
        "VALUES ('org_timeline', 'cus_timeline', 'Timeline', 3) RETURNING id"
    )
    every = max(1, inbox_rows // events)  # one row in `every` is the workspace's, alternately Stripe's and Clerk's
    await run.pool.execute(
        """
        INSERT INTO webhook_event (provider, event_id, type, payload, received_at, processed_at, attempts, tenant_key)
        SELECT CASE WHEN g % 2 = 0 THEN 'stripe' ELSE 'clerk' END, 'evt_timeline_' || g,
               CASE WHEN g % 2 = 0 THEN 'customer.subscription.updated' ELSE 'organizationMembership.created' END,
               jsonb_build_object('id', 'evt_timeline_' || g),
               now() - make_interval(secs => ($1::int - g) * 2.0),
               now() - make_interval(secs => ($1::int - g) * 2.0 - 1),
               1,
               CASE WHEN g % $2::int = 0 AND g / $2::int <= $3::int
                    THEN CASE WHEN g % 2 = 0 THEN 'cus_timeline' ELSE 'org:org_timeline' END
                    ELSE 'cus_other' || (g % 50000) END
        FROM generate_series(1, $1::int) AS g
        """,
        inbox_rows,
        every,
        events,
    )
    # Half the workspace's journal: the changes of its newest events, a second after each arrived.
    await run.pool.execute(
        """
        INSERT INTO workspace_change (workspace_id, at, source, entity, entity_id, changes)
        SELECT $1, received_at + interval '1 second', 'webhook_event:' || id, 'workspace', $1,
               jsonb_build_object('seat_quantity', jsonb_build_array(id % 10, id % 10 + 1))
        FROM webhook_event WHERE tenant_key IN ('cus_timeline', 'org:org_timeline')
        ORDER BY received_at DESC LIMIT $2::int
        """,
        workspace,
        journal_rows // 2,
    )
    # The other half by the member-limit job, between them; and as many rows of a hundred other workspaces.
    await run.pool.execute(
        """
        INSERT INTO workspace_change (workspace_id, at, source, entity, entity_id, changes)
        SELECT $1, now() - make_interval(secs => g * 7.0), 'ApplyWorkspaceMemberLimitJob', 'workspace_member', g,
               jsonb_build_object('suspended_at', jsonb_build_array(NULL, now()::text))
        FROM generate_series(1, $2::int) AS g
        """,
        workspace,
        journal_rows - journal_rows // 2,
    )
    await run.pool.execute(
        """
        INSERT INTO workspace_change (workspace_id, at, source, entity, entity_id, changes)
        SELECT $1 + 1 + g % 100, now() - make_interval(secs => g * 3.0), 'ApplyWorkspaceMemberLimitJob',
               'workspace_member', g, jsonb_build_object('suspended_at', jsonb_build_array(NULL, now()::text))
        FROM generate_series(1, $2::int) AS g
        """,
        workspace,
        journal_rows,
    )
    await run.pool.execute("VACUUM ANALYZE webhook_event")
    await run.pool.execute("VACUUM ANALYZE workspace_change")
    return int(workspace)


async def _ask(url: str, path: str, requests: int) -> tuple[list[float], int]:
    """Log in, warm up, then the page ``requests`` times: each one's seconds, and the entries the page showed.

    The session cookie is ``Secure`` (the bench runs with ``APP_ENV=production``) and this is plain HTTP on
    loopback, where a client keeps it to itself: it is carried by hand.
    """
    jar: dict[str, str] = {}

    async def get(client: httpx.AsyncClient, target: str) -> httpx.Response:
        return kept(await client.get(target, headers=cookie()))

    def cookie() -> dict[str, str]:
        return {"Cookie": "; ".join(f"{name}={value}" for name, value in jar.items())} if jar else {}

    def kept(response: httpx.Response) -> httpx.Response:
        jar.update(response.cookies.items())
        return response

    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        token = _CSRF.search((await get(client, "/ops")).text)
        assert token is not None, "no login form on /ops"
        login = {"_csrf": token.group(1), "password": OPS_PASSWORD}
        kept(await client.post("/ops/login", data=login, headers=cookie()))
        timings = []
        for n in range(WARM_UP_REQUESTS + requests):
            started = time.perf_counter()
            page = await get(client, path)
            elapsed = time.perf_counter() - started
            if page.status_code != 200:
                raise RuntimeError(f"GET {path} answered {page.status_code}")
            if n >= WARM_UP_REQUESTS:
                timings.append(elapsed)
        return timings, page.text.count('<li class="entry ')
