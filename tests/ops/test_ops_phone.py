"""The operations page on a phone (390 px wide), in a real headless Chromium: every page fits the screen, no name is
broken mid-word, every control is a thumb's size, forms keep their labels with their fields, an event's whole row
is its link, and refusals look like errors. Each page is photographed at that size."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from playwright.async_api import Browser

from app.core.resources import Resources
from tests.ops.conftest import PHONE, OpsPage, event_row, open_tab, screenshot, seed_known_events

pytestmark = pytest.mark.slow

# Ids and types as the providers write them: the longest names a row shows.
CHECKOUT_EVENT_ID = "evt_1QZx8vLkdIwHu7ixAbCdEfGh"
MEMBERSHIP_EVENT_ID = "msg_2ZJxYk8wBvN3q5pT7rLmXc9hQaE"
CHECKOUT_ERROR = (
    "ConnectionError: Stripe did not answer reading checkout session cs_try_it within 10s, or the connection to "
    "http://127.0.0.1:12111 failed (Unexpected error communicating with Stripe); retried with backoff."
)

# Everything a page shows that does not fit: the page wider than the screen, boxes whose content runs out of them
# (a code block may scroll sideways: the payload), a word split over two lines or wider than the box it is in (a
# truncated one must carry its whole text in its title), a no-wrap stretch on two lines, a control under 44 px.
LAYOUT_FAULTS = r"""
() => {
  const faults = [];
  const shown = (e) => e.getClientRects().length > 0 && getComputedStyle(e).visibility !== "hidden";
  const say = (e) => `${e.tagName.toLowerCase()}${e.id ? "#" + e.id : ""} "${e.textContent.trim().slice(0, 40)}"`;
  const lines = (range) =>
    new Set([...range.getClientRects()].filter((r) => r.width > 0).map((r) => Math.round(r.top)));
  const box = (e) => { while (getComputedStyle(e).display.startsWith("inline")) e = e.parentElement; return e; };

  const overflow = document.documentElement.scrollWidth - window.innerWidth;
  if (overflow > 0) faults.push(`the page is ${overflow} px wider than the screen`);

  for (const e of document.body.querySelectorAll("*")) {
    if (!shown(e) || e.matches("pre#payload, pre#payload *")) continue;
    const style = getComputedStyle(e);
    if (e.scrollWidth > e.clientWidth + 1 && !style.display.startsWith("inline") && style.textOverflow !== "ellipsis")
      faults.push(`content wider than its box: ${say(e)}`);
    if (style.textOverflow === "ellipsis" && e.title !== e.textContent)
      faults.push(`truncated without its whole text in its title: ${say(e)}`);
    if (style.whiteSpace === "nowrap" && style.display === "inline" && e.textContent.trim()) {
      const range = document.createRange();
      range.selectNodeContents(e);
      if (lines(range).size > 1) faults.push(`a no-wrap stretch on two lines: ${say(e)}`);
    }
  }

  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode, parent = node.parentElement;
    if (!parent || !shown(parent) || parent.closest("pre")) continue;
    const truncated = parent.closest(".truncate");
    const limits = box(parent).getBoundingClientRect();
    for (const word of node.data.matchAll(/\S+/g)) {
      const range = document.createRange();
      range.setStart(node, word.index);
      range.setEnd(node, word.index + word[0].length);
      if (lines(range).size > 1) faults.push(`"${word[0]}" broken over two lines in ${say(parent)}`);
      const r = range.getBoundingClientRect();
      if (!truncated && (r.left < limits.left - 1 || r.right > limits.right + 1 || r.right > window.innerWidth))
        faults.push(`"${word[0]}" wider than its box in ${say(parent)}`);
    }
  }

  for (const e of document.querySelectorAll("a, button, input:not([type=hidden]), select")) {
    if (!shown(e)) continue;
    const r = (e.classList.contains("row-link") ? e.closest("tr") : e).getBoundingClientRect();
    if (r.width < 44 || r.height < 44)
      faults.push(`a ${Math.round(r.width)}x${Math.round(r.height)} px target: ${say(e)}`);
  }
  return faults;
}
"""


@pytest.fixture
async def phone(browser: Browser, ops_api: str) -> AsyncIterator[OpsPage]:
    tab = await open_tab(browser, ops_api, viewport=PHONE, device_scale_factor=2, is_mobile=True, has_touch=True)
    yield tab
    await tab.context.close()


async def seed_real_names(resources: Resources) -> int:
    """Rows named as Stripe and Clerk name them: a failed checkout (its row id returned), a processed membership."""
    now = datetime.now(UTC)
    checkout = event_row("stripe", 900, attempts=2, last_error=CHECKOUT_ERROR)
    checkout.event_id, checkout.type = CHECKOUT_EVENT_ID, "checkout.session.completed"
    checkout.payload = {"id": CHECKOUT_EVENT_ID, "type": checkout.type, "data": {"object": {"id": "cs_try_it"}}}
    membership = event_row("clerk", 900, attempts=1, processed_at=now - timedelta(minutes=29))
    membership.event_id, membership.type = MEMBERSHIP_EVENT_ID, "organizationMembership.created"
    async with resources.db.session() as session:
        session.add_all([checkout, membership])
        await session.commit()
    return checkout.id


async def check_page(tab: OpsPage, path: str, picture: str, tmp_path: Path) -> None:
    """Open ``path`` (unless it is open already), photograph it, and assert that it fits a phone."""
    if path != tab.page.url.removeprefix(tab.base_url):
        await tab.open(path)
    if picture == "ops-overview-phone.png":
        await screenshot(tab.page, picture, tmp_path)  # `make screenshots`: the picture docs/operations.md shows
    else:
        await tab.page.screenshot(path=str(tmp_path / picture), full_page=True)
    faults = await tab.page.evaluate(LAYOUT_FAULTS)
    assert not faults, f"{path} on a {PHONE['width']} px screen:\n" + "\n".join(faults)


async def test_every_page_fits_a_phone_sized_screen(phone: OpsPage, resources: Resources, tmp_path: Path) -> None:
    await seed_known_events(resources)
    checkout_row = await seed_real_names(resources)

    await phone.log_in("not the password")
    await check_page(phone, "/ops/login", "ops-login-refused-phone.png", tmp_path)  # the refusal, as answered
    await phone.log_in()
    for path, picture in (
        ("/ops", "ops-overview-phone.png"),
        ("/ops/events", "ops-events-phone.png"),
        ("/ops/events?state=failed", "ops-events-failed-phone.png"),
        (f"/ops/events/{checkout_row}", "ops-event-phone.png"),
        ("/ops/events/999999", "ops-not-found-phone.png"),
    ):
        await check_page(phone, path, picture, tmp_path)

    await phone.open(f"/ops/events/{checkout_row}")
    assert await phone.page.locator("h1 .id").inner_text() == CHECKOUT_EVENT_ID  # whole on the event's page


async def test_on_a_phone_sized_screen_names_break_at_dots_and_capitals_only(
    phone: OpsPage, resources: Resources
) -> None:
    await seed_real_names(resources)
    await phone.log_in()

    cron = phone.page.locator('#crons td[data-label="Cron"] strong', has_text="WebhookRecoveryCronJob")
    assert await cron.inner_html() == "Webhook<wbr>Recovery<wbr>Cron<wbr>Job"
    await phone.open("/ops/events?provider=stripe")
    kind = phone.page.locator('#events td[data-label="Type"]').first
    assert await kind.inner_html() == "checkout.<wbr>session.<wbr>completed"
    assert await kind.inner_text() == "checkout.session.completed"
    event_id = phone.page.locator('#events td[data-label="Event id"] .truncate').first
    assert await event_id.get_attribute("title") == CHECKOUT_EVENT_ID  # the whole id on hover


async def test_on_a_phone_sized_screen_the_latency_is_one_cell_and_the_backfill_keeps_its_label(
    phone: OpsPage, resources: Resources
) -> None:
    await seed_known_events(resources)
    await phone.log_in()

    latency = phone.page.locator('#inbox tr[data-provider="stripe"] td.latency')
    assert await latency.inner_text() == "25 min / 25 min (4 events)"
    parts = [await latency.locator(".nowrap").nth(n).bounding_box() for n in range(3)]
    assert all(part is not None and part["height"] < 30 for part in parts)  # each on one line, none split

    form = phone.page.locator("form.backfill")
    label, field, hours, run = [
        await form.locator(selector).bounding_box() for selector in ("label", "#hours", ".field > span", "button")
    ]
    assert label and field and hours and run
    assert 0 <= field["y"] - (label["y"] + label["height"]) <= 12  # the label right above its field
    middles = [box["y"] + box["height"] / 2 for box in (field, hours, run)]
    assert max(middles) - min(middles) <= 2  # "[72] hours [Run]": one line, none of it left alone


async def test_on_a_phone_sized_screen_a_whole_row_opens_its_event(phone: OpsPage, resources: Resources) -> None:
    checkout_row = await seed_real_names(resources)
    await phone.log_in()
    await phone.open("/ops/events?provider=stripe")

    row = phone.page.locator(f'#events tr:has(a[href="/ops/events/{checkout_row}"])')
    received = await row.locator('td[data-label="Received"]').bounding_box()  # far from the row id's own link
    assert received is not None
    async with phone.page.expect_navigation():
        await phone.page.touchscreen.tap(received["x"] + received["width"] / 2, received["y"] + received["height"] / 2)

    assert phone.page.url == f"{phone.base_url}/ops/events/{checkout_row}"
    assert await phone.page.locator("#state").inner_text() == "failed"


async def test_on_a_phone_sized_screen_a_count_is_a_whole_line_to_tap(phone: OpsPage, resources: Resources) -> None:
    await seed_known_events(resources)
    await phone.log_in()

    line = phone.page.locator('#inbox tr[data-provider="stripe"] td[data-count="failed"]')
    box = await line.bounding_box()
    assert box is not None and box["height"] >= 44 and box["width"] >= 300
    async with phone.page.expect_navigation():
        await phone.page.touchscreen.tap(box["x"] + 20, box["y"] + box["height"] / 2)  # on the label, not the digit
    assert phone.page.url.endswith("/ops/events?provider=stripe&state=failed")


async def test_refusals_look_like_errors_and_what_was_done_does_not(phone: OpsPage) -> None:
    await phone.log_in("not the password")
    refused = phone.page.locator(".message")
    assert await refused.inner_text() == "Wrong password."
    assert await refused.get_attribute("class") == "message error"
    assert await refused.get_attribute("role") == "alert"
    refused_colour = await refused.evaluate("e => getComputedStyle(e).backgroundColor")

    await phone.log_in()
    done = phone.page.locator(".message")
    assert await done.inner_text() == "Logged in."
    assert (await done.get_attribute("class"), await done.get_attribute("role")) == ("message", "status")
    assert await done.evaluate("e => getComputedStyle(e).backgroundColor") != refused_colour

    await phone.page.fill("#hours", "0")
    await phone.page.evaluate("document.querySelector('form.backfill').noValidate = true")  # past the browser's check
    await phone.submit("Run")
    assert (await phone.message(), await phone.page.locator(".message").get_attribute("class")) == (
        "Give the hours to look back: a whole number from 1 to 720.",
        "message error",
    )
    await phone.open("/ops/events/999999")
    assert await phone.page.locator(".message.error").inner_text() == "No webhook event with row id 999999."
