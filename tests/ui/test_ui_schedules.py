"""The schedules list in a real headless Chromium: reached from the nav, each schedule with its name, timing,
suspend, last and next tick; a schedule's name is shown as text, never as HTML."""

from __future__ import annotations

from pathlib import Path

from agentrun.worker.store import RunStore
from tests.ui.test_ui import shot, stack  # skips this module without Chromium or Playwright

from playwright.async_api import Page, expect  # isort: skip  (after test_ui's check that Playwright is there)

RUN = {"input": "<img src=x onerror=alert(1)>", "tokenBudget": 1000, "timeoutSeconds": 60}


async def test_the_schedules_list_is_reachable_from_the_nav(
    store: RunStore, page: Page, tmp_path: Path
) -> None:
    async with stack(store) as (url, http):
        for body in ({"name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Berlin", "run": RUN},
                     {"name": "paused", "intervalSeconds": 3600, "run": RUN, "suspend": True}):
            r = await http.post("/api/schedules", json=body)
            assert r.status_code == 201, r.text
        await page.goto(f"{url}/ui/")
        await page.get_by_role("navigation", name="main").get_by_role("link", name="Schedules").click()
        await expect(page.get_by_role("heading", name="Schedules")).to_be_visible()
        nightly = page.locator("tr[data-schedule='nightly']")
        await expect(nightly).to_contain_text("0 3 * * * (Europe/Berlin)")
        await expect(nightly.locator("td").nth(2)).to_have_text("no")
        await expect(nightly.locator("td").nth(3)).to_have_text("–")  # no tick yet
        await expect(nightly.locator("td").nth(4)).to_contain_text("20")  # the next one, a date
        paused = page.locator("tr[data-schedule='paused']")
        await expect(paused).to_contain_text("every 3600s")
        await expect(paused.locator("td").nth(2)).to_have_text("suspended")
        await expect(paused.locator("td").nth(4)).to_have_text("–")
        await expect(page.locator("p[role=status]")).to_contain_text("2 schedules")
        assert await page.locator("img").count() == 0
        await page.screenshot(path=shot("ui-schedules.png", tmp_path), full_page=True)
