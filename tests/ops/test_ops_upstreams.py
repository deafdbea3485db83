"""The operations page's upstreams, in a real Chromium against a real API process: each one's state, since when
and its last error; a pause (for a while, or until resumed) and a resume, with their token, logged with the
client; the same states on ``/metrics``."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.billing.budget import STRIPE
from app.clients.email import EMAIL
from app.core.resources import Resources
from tests.ops.conftest import OpsPage, api_log, screenshot
from tests.ops.test_metrics import scrape, value

pytestmark = pytest.mark.slow


async def row_text(ops: OpsPage, name: str) -> dict[str, str]:
    row = ops.page.locator(f'#upstreams tr[data-upstream="{name}"]')
    cells = {}
    for label in ("State", "Since", "Rate", "Jobs waiting", "Last error"):
        cells[label] = (await row.locator(f'td[data-label="{label}"]').inner_text()).strip()
    return cells


async def test_the_overview_shows_each_upstreams_state_and_pauses_and_resumes_one(
    ops: OpsPage, resources: Resources, tmp_path: Path
) -> None:
    gate = STRIPE.of(resources).gate
    for customer in ("cus_a", "cus_b", "cus_c"):  # Stripe failing for three customers in a row: held
        await gate.record(f"customer {customer}", customer, error="HTTPStatusError: Stripe answered (HTTP 503)")
    await ops.log_in()

    stripe = await row_text(ops, "stripe")
    assert stripe["State"] == "held" and stripe["Since"].endswith("s ago") and stripe["Rate"] == "20/s"
    assert stripe["Last error"].endswith("HTTPStatusError: Stripe answered (HTTP 503)")
    email = await row_text(ops, "email")
    assert (email["State"], email["Last error"]) == ("ok", "—")
    await screenshot(ops.page, "ops-upstreams.png", tmp_path)

    await ops.page.fill("#for-email", "2h")
    await ops.submit("Pause", form='#upstreams tr[data-upstream="email"] form')
    assert (await ops.message()).startswith("Paused email until ")
    assert (await row_text(ops, "email"))["State"].startswith("paused until ")
    assert (await EMAIL.of(resources).status()).state == "paused"
    found = scrape(f"{ops.base_url}/metrics")
    assert [value(found, "upstream_state", upstream=name) for name in ("clerk", "email", "stripe")] == [0, 2, 1]

    await ops.submit("Resume", form='#upstreams tr[data-upstream="email"] form')
    assert await ops.message() == "Resumed email."
    assert (await row_text(ops, "email"))["State"] == "ok"
    await ops.submit("Pause", form='#upstreams tr[data-upstream="clerk"] form')  # no duration: until resumed
    assert await ops.message() == "Paused clerk until resumed."
    assert (await row_text(ops, "clerk"))["State"] == "paused until resumed"

    log = api_log(tmp_path)
    for line in (
        "Operations page: pause upstream email for 2h, asked by 127.0.0.1.",
        "Operations page: resume upstream email, asked by 127.0.0.1.",
        "Operations page: pause upstream clerk until resumed, asked by 127.0.0.1.",
    ):
        assert line in log


async def test_a_pause_without_its_token_a_wrong_duration_or_an_unknown_upstream_changes_nothing(
    ops: OpsPage, resources: Resources
) -> None:
    await ops.log_in()
    request = ops.page.request  # the browser's session, but no form token
    response = await request.post(f"{ops.base_url}/ops/upstreams/stripe/pause", form={"for": "2h"})
    assert response.status == 403 and "CSRF token is missing or wrong" in await response.text()

    await ops.page.fill("#for-stripe", "two hours")
    await ops.submit("Pause", form='#upstreams tr[data-upstream="stripe"] form')
    assert await ops.message() == "'two hours' is not a duration: give one like 30m, 2h or 7d, or none."
    assert (await STRIPE.of(resources).status()).state == "ok"

    token = await ops.page.locator('#upstreams input[name="_csrf"]').first.get_attribute("value")
    unknown = await request.post(f"{ops.base_url}/ops/upstreams/stirpe/pause", form={"_csrf": str(token)})
    assert unknown.status == 404 and "the known upstreams are: clerk, email, stripe" in await unknown.text()
