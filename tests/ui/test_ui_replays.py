"""The replays pages in a real headless Chromium: the list reached from the nav, a replay's report with a verdict
per recorded run and the totals, and a pair's recorded and replayed conversations side by side; what the runs
say is shown as text, never as HTML."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import psycopg

from agentrun.worker.store import RunStore
from tests.replays.conftest import recorded
from tests.replays.test_api import CALLS, finish
from tests.support.serving import serving
from tests.ui.test_ui import app_for, shot  # skips this module without Chromium or Playwright

from playwright.async_api import Page, expect  # isort: skip  (after test_ui's check that Playwright is there)

HOSTILE = "<img src=x onerror=alert(1)>"


async def test_a_replays_report_and_a_pair_side_by_side(
    store: RunStore, db: psycopg.AsyncConnection[Any], page: Page, tmp_path: Path,
) -> None:
    a = await recorded(store, db, CALLS, input="Pay bob his 5 dollars", answer="Paid bob.")
    b = await recorded(store, db, CALLS[:1], input=f"Charge ann {HOSTILE}", answer="Charged ann.")
    await db.execute("UPDATE run SET tokens_used = 1200 WHERE id IN (%s, %s)", (a.id, b.id))
    async with serving(app_for(store)) as url, httpx.AsyncClient(base_url=url) as http:
        r = await http.post("/api/replays", json={"runs": [str(a.id), str(b.id)], "change": {"model": "claude-haiku-4-5"}})
        assert r.status_code == 201, r.text
        replay_id = r.json()["id"]
        results = {x["recordedRunId"]: x["replayRunId"] for x in (await http.get(f"/api/replays/{replay_id}")).json()["results"]}
        await finish(db, results[str(a.id)], CALLS, answer="Paid bob.", tokens=800)
        await finish(db, results[str(b.id)], [("refund", {"to": "ann"}, HOSTILE)], answer=HOSTILE, tokens=900)

        await page.goto(f"{url}/ui/")
        await page.get_by_role("navigation", name="main").get_by_role("link", name="Replays").click()
        await expect(page.get_by_role("heading", name="Replays")).to_be_visible()
        row = page.locator(f"tr[data-replay='{replay_id}']")
        await expect(row).to_contain_text("COMPLETED")  # the first read of the report scored it: 50%
        await expect(row).to_contain_text("model claude-haiku-4-5")
        await page.screenshot(path=shot("ui-replays.png", tmp_path), full_page=True)

        await row.get_by_role("link").click()
        await expect(page.get_by_role("heading", name="Replay")).to_contain_text(replay_id[:8])
        await expect(page.locator("[data-pass-rate]")).to_have_text("50%")
        await expect(page.get_by_text("1 of 2 judged")).to_be_visible()
        await expect(page.get_by_text("against 2,400 recorded (-29%)")).to_be_visible()
        passed = page.locator(f"tr[data-replay-run='{results[str(a.id)]}']")
        failed = page.locator(f"tr[data-replay-run='{results[str(b.id)]}']")
        await expect(passed.locator(".verdict")).to_have_text("pass")
        await expect(failed.locator(".verdict")).to_have_text("fail")
        await expect(failed.locator("td").nth(4)).to_have_text("1")  # the tool-call distance

        await failed.get_by_role("button", name="Compare").click()
        pair = page.get_by_role("region", name="recorded and replayed run, side by side")
        await expect(pair).to_contain_text("distance 1")
        recorded_side = pair.get_by_role("region", name="Recorded conversation")
        replayed_side = pair.get_by_role("region", name="Replayed conversation")
        await expect(recorded_side).to_contain_text("tool call · charge")
        await expect(replayed_side).to_contain_text("tool call · refund")
        await expect(replayed_side).to_contain_text(HOSTILE)  # as text
        await expect(recorded_side).to_contain_text(f"Charge ann {HOSTILE}")
        assert await page.locator("img").count() == 0
        await page.screenshot(path=shot("ui-replay.png", tmp_path), full_page=True)

        # The replay run's own page says what it replays.
        await replayed_side.get_by_role("link", name=results[str(b.id)][:8]).click()
        await expect(page.locator("#replay-of")).to_contain_text(f"Replay of run {str(b.id)[:8]} in replay {replay_id[:8]}")
        await page.screenshot(path=shot("ui-replay-run.png", tmp_path))
        await page.locator("#replay-of").get_by_role("link", name=replay_id[:8]).click()
        await expect(page.locator("[data-pass-rate]")).to_have_text("50%")

        await page.goto(f"{url}/ui/#/replays/00000000-0000-0000-0000-000000000001")
        await expect(page.get_by_role("alert")).to_contain_text("No replay")
