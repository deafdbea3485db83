"""The operations page in a real headless Chromium, against a real API process, Postgres and Redis."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Browser

from app.core.resources import Resources
from app.ops.auth import LOGIN_FAILURES_PER_MINUTE
from app.ops.pipeline_state import read_state
from app.queue.crons import next_tick
from app.queue.models import CronRun
from app.testing import signed_stripe_delivery, stripe_event
from app.webhooks.inbox import Inbox
from app.webhooks.jobs import deduplication_id, queue_processing
from app.webhooks.refusals import refused_last_hour
from tests.ops.conftest import OpsPage, api_log, event_row, open_tab, screenshot, seed_known_events
from tests.processes import logged_api_process, wait_for

pytestmark = pytest.mark.slow

COUNTED = ("pending", "failed", "set_aside", "processed_24h")


async def shown_counts(ops: OpsPage) -> dict[str, dict[str, int]]:
    shown: dict[str, dict[str, int]] = {}
    for row in await ops.page.locator("#inbox tbody tr").all():
        provider = await row.get_attribute("data-provider")
        assert provider is not None
        cells = {name: await row.locator(f'[data-count="{name}"]').inner_text() for name in (*COUNTED, "refused_1h")}
        shown[provider] = {name: int(text) for name, text in cells.items()}
    return shown


async def refused_counted(resources: Resources, namespace: str) -> bool:
    return (await refused_last_hour(resources.redis, namespace, ["stripe"]))["stripe"] == 2


async def listed_rows(ops: OpsPage) -> list[tuple[int, str]]:
    """(row id, state) of each event the list shows."""
    listed = []
    for row in await ops.page.locator("#events tbody tr[data-state]").all():
        state = await row.get_attribute("data-state")
        listed.append((int(await row.locator("td").first.inner_text()), str(state)))
    return listed


async def test_without_ops_password_the_page_does_not_exist(
    browser: Browser, settings_env: dict[str, str], tmp_path: Path
) -> None:
    with logged_api_process(settings_env, tmp_path / "api.log") as base_url:
        tab = await open_tab(browser, base_url)
        for path in ("/ops", "/ops/events", "/ops/static/ops.css"):
            assert (await tab.open(path)).status == 404, path
        response = await tab.page.request.post(base_url + "/ops/login", form={"password": "anything"})
        assert response.status == 404


async def test_a_wrong_password_is_refused_and_tries_are_limited(ops: OpsPage) -> None:
    for _ in range(LOGIN_FAILURES_PER_MINUTE):
        response = await ops.log_in("not the password")
        assert response.status == 401
        assert await ops.message() == "Wrong password."
    response = await ops.log_in("not the password")
    assert response.status == 429
    assert response.headers["retry-after"] == "60"
    assert "wait a minute" in await ops.message()
    response = await ops.log_in()  # the right password too, until the minute has passed
    assert response.status == 429
    assert await ops.page.locator("#inbox").count() == 0


async def test_the_overview_shows_the_databases_counts(
    ops: OpsPage, resources: Resources, redis_namespace: str, tmp_path: Path
) -> None:
    known = await seed_known_events(resources)
    bad = signed_stripe_delivery(stripe_event("invoice.paid", {"id": "in_1"}), "whsec_" + "d3Jvbmctc2VjcmV0LXdyb25n")
    async with httpx.AsyncClient(base_url=ops.base_url) as client:
        for _ in range(2):  # a wrong secret: two refusals
            response = await client.post("/webhooks/stripe", content=bad.body, headers=bad.headers)
            assert response.status_code == 400
    # Counted beside the answer (a refusal never waits for Redis): the count may land just after it.
    await wait_for(
        lambda: refused_counted(resources, redis_namespace), within=10, what="the two refusals counted in Redis"
    )

    logged_in = await ops.log_in()

    assert logged_in.status == 200
    assert await ops.message() == "Logged in."
    shown = await shown_counts(ops)
    database = await Inbox(resources.db).counts()
    for provider, counts in known.counts.items():
        assert {name: shown[provider][name] for name in COUNTED} == counts
        assert {name: database.get(provider, {}).get(name, 0) for name in COUNTED} == counts
    assert shown["stripe"]["refused_1h"] == 2 and shown["clerk"]["refused_1h"] == 0
    latency = await ops.page.locator('#inbox tr[data-provider="stripe"] td').last.inner_text()
    assert latency == "25 min / 25 min (4 events)"  # received 30 min ago, processed 25 min later
    assert await ops.page.locator("#workers").inner_text() == "0 workers alive."
    assert "WebhookRecoveryCronJob" in await ops.page.locator("#crons").inner_text()
    assert not ops.other_hosts()
    await screenshot(ops.page, "ops-overview.png", tmp_path)

    # Each count is a link to what is behind it: the refusals by reason, the events of that state.
    for provider in shown:
        for name in (*COUNTED, "refused_1h"):
            assert await ops.page.locator(f'#inbox tr[data-provider="{provider}"] [data-count="{name}"] a').count() == 1
    refusals = ops.page.locator('#refused-stripe tr[data-reason="rejected_signature"] [data-label="Refused"]')
    assert await refusals.inner_text() == "2"
    await ops.page.locator('#inbox tr[data-provider="stripe"] [data-count="processed_24h"] a').click()
    listed = await listed_rows(ops)
    assert [state for _, state in listed] == ["processed"] * known.counts["stripe"]["processed_24h"]


async def test_the_events_list_filters_and_pages(ops: OpsPage, resources: Resources) -> None:
    known = await seed_known_events(resources)
    await ops.log_in()

    await ops.open("/ops/events")
    await ops.page.select_option('select[name="state"]', "set_aside")
    await ops.submit("Filter")
    assert sorted(row for row, _ in await listed_rows(ops)) == sorted(known.set_aside_rows)
    await ops.page.fill('input[name="provider"]', "clerk")
    await ops.submit("Filter")
    assert sorted(row for row, _ in await listed_rows(ops)) == sorted(known.set_aside_rows[1:])

    await ops.open("/ops/events?type=user.updated")
    assert len(await listed_rows(ops)) == 4  # every clerk row, none of stripe's
    await ops.open("/ops/events?event_id=evt_ops_stripe_3")
    assert await listed_rows(ops) == [(known.failed_row, "failed")]

    async with resources.db.session() as session:
        session.add_all(event_row("stripe", n) for n in range(100, 150))
        await session.commit()
    await ops.open("/ops/events?provider=stripe")
    first = await listed_rows(ops)
    assert len(first) == 50
    async with ops.page.expect_navigation():
        await ops.page.get_by_role("link", name="Older events").click()
    second = await listed_rows(ops)
    assert len(first) + len(second) == 60 and not {r for r, _ in first} & {r for r, _ in second}
    assert [r for r, _ in first + second] == sorted((r for r, _ in first + second), reverse=True)


async def test_the_reopen_button_reopens_every_set_aside_event(
    ops: OpsPage, resources: Resources, tmp_path: Path
) -> None:
    known = await seed_known_events(resources)
    await ops.log_in()

    response = await ops.submit("Reopen every set-aside event")

    assert response.status == 200
    assert await ops.message() == "Reopened 3 webhook events."
    counts = await Inbox(resources.db).counts()
    assert [counts[provider].get("set_aside", 0) for provider in ("stripe", "clerk")] == [0, 0]
    for row_id in known.set_aside_rows:
        event = await Inbox(resources.db).get(row_id)
        assert event is not None and event.state == "pending"
    assert (await shown_counts(ops))["clerk"]["set_aside"] == 0
    assert "Operations page: reopen every set-aside webhook event, asked by 127.0.0.1." in api_log(tmp_path)


async def test_a_post_without_the_csrf_token_is_refused(ops: OpsPage, resources: Resources) -> None:
    known = await seed_known_events(resources)
    await ops.log_in()
    request = ops.page.request  # the browser's cookies (the session), but no form token

    forms: list[tuple[str, dict[str, str | float | bool]]] = [
        ("/ops/reopen", {}),
        ("/ops/reopen", {"_csrf": "forged"}),
        ("/ops/backfill", {"hours": "1"}),
    ]
    for path, form in forms:
        response = await request.post(ops.base_url + path, form=form)
        assert response.status == 403, path
        assert "CSRF token is missing or wrong" in await response.text()
    assert (await Inbox(resources.db).counts())["stripe"]["set_aside"] == 1
    assert (await Inbox(resources.db).get(known.set_aside_rows[0])) is not None


async def test_the_session_cookie_is_httponly_strict_and_limited_to_ops(ops: OpsPage) -> None:
    await ops.log_in()

    (cookie,) = [cookie for cookie in await ops.context.cookies() if cookie["name"] == "ops_session"]
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    assert cookie["path"] == "/ops"
    assert cookie["secure"] is False  # APP_ENV=test over plain HTTP; production below
    assert await ops.page.evaluate("document.cookie") == ""  # no script can read it


async def test_actions_say_what_they_did_and_are_logged_with_the_client(
    ops: OpsPage, resources: Resources, tmp_path: Path
) -> None:
    known = await seed_known_events(resources)
    await ops.log_in()

    await ops.page.locator("#crons tr", has_text="WebhookRecoveryCronJob").get_by_role("button").click()
    await ops.page.wait_for_selector(".message")
    assert await ops.message() == "Cron WebhookRecoveryCronJob queued: a worker runs it now."
    await ops.page.fill("#hours", "6")
    await ops.submit("Run")
    assert await ops.message() == "Backfill of the last 6 hours of Stripe events queued: a worker runs it."
    await ops.open(f"/ops/events/{known.failed_row}")
    await ops.submit("Retry")
    assert await ops.message() == f"Queued stripe event evt_ops_stripe_3 (row {known.failed_row})."

    waiting = (await read_state(resources, {})).waiting
    assert waiting["cron-queue"] >= 1 and waiting["webhook-stripe-queue"] >= 1  # the tick, and the event's job
    log = api_log(tmp_path)
    for line in (
        "Operations page: run cron WebhookRecoveryCronJob, asked by 127.0.0.1.",
        "Operations page: backfill Stripe events of the last 6 h, asked by 127.0.0.1.",
        f"Operations page: retry webhook event row {known.failed_row}, asked by 127.0.0.1.",
    ):
        assert line in log


async def test_reloading_the_page_an_action_answered_with_does_not_do_it_again(
    ops: OpsPage, resources: Resources, tmp_path: Path
) -> None:
    async with resources.db.session() as session:
        row = event_row("stripe", 1, processed_at=datetime.now(UTC), attempts=1)
        session.add(row)
        await session.commit()
    await ops.log_in()
    await ops.open(f"/ops/events/{row.id}")

    response = await ops.submit("Replay")

    assert response.status == 200 and response.url == f"{ops.base_url}/ops/events/{row.id}"
    redirect = response.request.redirected_from
    assert redirect is not None and redirect.method == "POST"  # the POST answered 303, the page is a GET
    assert await ops.message() == f"Replaying stripe event evt_ops_stripe_1 (row {row.id})."
    methods: list[str] = []
    ops.page.on("request", lambda request: methods.append(request.method))
    reloaded = await ops.page.reload()
    assert reloaded is not None and reloaded.status == 200
    assert methods and set(methods) == {"GET"}
    assert await ops.page.locator(".message").count() == 0  # the message is shown once
    assert api_log(tmp_path).count(f"Operations page: replay webhook event row {row.id}, asked by") == 1


async def test_the_page_allows_no_script_and_nothing_from_another_host(ops: OpsPage, resources: Resources) -> None:
    known = await seed_known_events(resources)
    pages = ["/ops"]  # the login form
    await ops.log_in()
    pages += ["/ops", "/ops/events?state=failed", f"/ops/events/{known.failed_row}", "/ops/events/999999"]

    for path in pages:
        response = await ops.open(path)
        policy = response.headers["content-security-policy"]
        directives = {part.split()[0]: part.split()[1:] for part in policy.split(";") if part.strip()}
        assert directives["default-src"] == ["'none'"], path  # so no script-src: no script at all
        assert not {"script-src", "script-src-elem", "connect-src"} & set(directives), path
        assert all(source in ("'self'", "'none'") for sources in directives.values() for source in sources), policy
        assert directives["form-action"] == ["'self'"] and directives["frame-ancestors"] == ["'none'"]
        assert await ops.page.locator("script").count() == 0, path
    assert not ops.other_hosts()


async def test_without_javascript_an_operator_logs_in_filters_and_retries(
    browser: Browser, ops_api: str, resources: Resources, tmp_path: Path
) -> None:
    known = await seed_known_events(resources)
    tab = await open_tab(browser, ops_api, java_script_enabled=False)
    assert await tab.page.evaluate("1 + 1") == 2  # Playwright's own scripts still run; the page's would not

    response = await tab.log_in()
    assert response.status == 200 and await tab.message() == "Logged in."
    await tab.open("/ops/events")
    await tab.page.select_option('select[name="state"]', "failed")
    await tab.page.fill('input[name="provider"]', "stripe")
    await tab.submit("Filter")
    assert tab.page.url.endswith("/ops/events?provider=stripe&state=failed&type=&event_id=&tenant=")
    assert sorted(state for _, state in await listed_rows(tab)) == ["failed", "failed"]
    async with tab.page.expect_navigation():
        await tab.page.get_by_role("link", name=str(known.failed_row)).click()
    await tab.submit("Retry")

    assert await tab.message() == f"Queued stripe event evt_ops_stripe_3 (row {known.failed_row})."
    assert await resources.queue.state(deduplication_id(known.failed_row), "webhook-stripe-queue") == "queued"
    assert f"Operations page: retry webhook event row {known.failed_row}, asked by 127.0.0.1." in api_log(tmp_path)
    await tab.context.close()


async def test_the_overview_shows_the_jobs_waiting_per_queue_and_each_crons_last_run_result_and_next_tick(
    ops: OpsPage, resources: Resources
) -> None:
    known = await seed_known_events(resources)
    for provider, row_id in zip(
        ("stripe", "stripe", "clerk"), (known.failed_row, *known.set_aside_rows[:2]), strict=True
    ):
        await queue_processing(resources.queue, provider, row_id)
    now = datetime.now(UTC)
    ok_slot, failed_slot = now.replace(second=0, microsecond=0) - timedelta(minutes=10), now - timedelta(hours=2)
    async with resources.db.session() as session:
        session.add_all(
            [
                CronRun(name="WebhookRecoveryCronJob", slot=ok_slot, started_at=ok_slot, finished_at=ok_slot),
                CronRun(
                    name="WebhookRetentionCronJob",
                    slot=failed_slot,
                    started_at=failed_slot,
                    finished_at=failed_slot,
                    error="RuntimeError: disk full",
                ),
            ]
        )
        await session.commit()

    await ops.log_in()

    queues = {}
    for row in await ops.page.locator("#queues tbody tr").all():
        queue = await row.locator('[data-label="Queue"]').inner_text()
        queues[queue] = await row.locator('[data-label="Jobs waiting"]').inner_text()
    assert queues["webhook-stripe-queue"] == "2" and queues["webhook-clerk-queue"] == "1"
    assert queues["cron-queue"] == "0"
    crons = {}
    for row in await ops.page.locator("#crons tbody tr").all():
        cells = {
            label: await row.locator(f'[data-label="{label}"]').inner_text()
            for label in ("Cron", "Last run", "Result", "Next tick")
        }
        crons[cells.pop("Cron")] = cells
    minute = "%Y-%m-%d %H:%M"
    assert crons["WebhookRecoveryCronJob"] == {
        "Last run": ok_slot.strftime(minute),
        "Result": "ok",
        "Next tick": next_tick("*/10 * * * *", datetime.now(UTC)).strftime(minute),
    }
    assert crons["WebhookRetentionCronJob"]["Result"] == "failed: RuntimeError: disk full"
    assert crons["WebhookRetentionCronJob"]["Next tick"] == next_tick("30 3 * * *", now).strftime(minute)
    assert crons["WebhookBackfillCronJob"]["Last run"] == "never"


async def test_log_out_sits_on_the_line_of_the_other_links(ops: OpsPage, tmp_path: Path) -> None:
    await ops.log_in()
    boxes = {}
    for name, locator in (
        ("brand", ops.page.locator("header .brand")),
        ("Overview", ops.page.locator("nav").get_by_role("link", name="Overview")),
        ("Events", ops.page.locator("nav").get_by_role("link", name="Events")),
        ("Log out", ops.page.locator("nav").get_by_role("button", name="Log out")),
    ):
        box = await locator.bounding_box()
        assert box is not None, name
        boxes[name] = box
    await ops.page.locator("header").screenshot(path=str(tmp_path / "header.png"))
    middles = {name: box["y"] + box["height"] / 2 for name, box in boxes.items()}
    assert max(middles.values()) - min(middles.values()) <= 1, middles


async def test_the_latency_of_one_event_says_one_event(ops: OpsPage, resources: Resources) -> None:
    async with resources.db.session() as session:
        session.add(event_row("clerk", 1, attempts=1, processed_at=datetime.now(UTC) - timedelta(minutes=20)))
        await session.commit()
    await ops.log_in()
    latency = await ops.page.locator('#inbox tr[data-provider="clerk"] td').last.inner_text()
    assert latency == "10 min / 10 min (1 event)"
