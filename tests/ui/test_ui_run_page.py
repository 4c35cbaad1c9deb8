"""A run's page in a real headless Chromium (issue 29): user messages drawn as such, the step chart on the run's
own time (inherited steps marked off the axis, a wait for a person a labelled span), a worker change after a
wait said plainly and a takeover only after a crash, a cancelled wait abandoned and no red error, an unpriced
cost said so, icons that need no font, and the step inspector (formatted, raw, download)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from agentrun.worker.store import RunStore
from tests.ui.test_ui import (  # skips this module without Chromium or Playwright
    GATE,
    Page,
    expect,
    shot,
    stack,
    submit,
    wait_status,
)


async def _sql(store: RunStore, query: str, *args: object) -> None:
    async with store.pool.connection() as conn:
        await conn.execute(query, args)


async def test_a_continuation_draws_its_user_message_and_keeps_its_axis_to_its_own_steps(
    store: RunStore, page: Page, tmp_path: Path
) -> None:
    async with stack(store) as (url, http):
        GATE.set()
        source = await submit(http)
        await wait_status(http, source, "SUCCEEDED")
        r = await http.post("/api/runs", json={"continueFrom": source, "input": "And which are due this week?",
                                               "tokenBudget": 50_000, "timeoutSeconds": 300})
        assert r.status_code == 201, r.text
        cont = r.json()["id"]
        await wait_status(http, cont, "SUCCEEDED")
        # The inherited steps ran an hour before (as a continuation of yesterday's run would).
        await _sql(store, "UPDATE run_step SET started_at = started_at - interval '1 hour', "
                   "finished_at = finished_at - interval '1 hour' WHERE run_id = %s AND inherited", cont)
        await page.goto(f"{url}/ui/#/runs/{cont}")
        await expect(page.locator(".run-head")).to_contain_text("SUCCEEDED")
        rows = page.locator(".wf-row")
        await expect(rows.first).to_have_class(re.compile(r"\binherited\b"))
        await expect(rows.first.locator(".wf-note")).to_contain_text("inherited")
        users = page.locator(".wf-row.user")
        await expect(users).to_have_count(2)  # the source's input and the continuation's
        for i in range(2):
            await expect(users.nth(i)).to_contain_text("user message")
            await expect(users.nth(i)).not_to_contain_text("tool")
            await expect(users.nth(i).locator(".wf-bar")).to_have_count(0)
        own_user = page.locator(".wf-row.user:not(.inherited)")
        await expect(own_user.locator(".wf-mark.user")).to_have_count(1)
        # The axis is the continuation's own few seconds, not the hour since the inherited steps.
        axis = await page.locator(".wf-axis span").last.inner_text()
        assert float(axis.split(" ")[0]) < 600, axis
        assert "own" in axis
        await expect(page.locator(".legend")).to_contain_text("inherited")
        await expect(page.locator(".conversation")).to_contain_text("And which are due this week?")
        await page.screenshot(path=shot("ui-continuation.png", tmp_path), full_page=True)


async def test_a_resume_after_an_approval_is_no_takeover_and_its_wait_is_a_labelled_span(
    store: RunStore, page: Page, tmp_path: Path
) -> None:
    async with stack(store) as (url, http):
        GATE.set()
        run_id = await submit(http, requireApproval=["list_tickets"])
        await wait_status(http, run_id, "WAITING")
        await page.goto(f"{url}/ui/#/runs/{run_id}")
        waited = page.locator(".decision .waited")
        await expect(waited).to_contain_text("waiting for")
        await expect(page.locator(".wf-row[data-status='WAITING'] .wf-wait")).to_have_count(1)
        await page.screenshot(path=shot("ui-waiting.png", tmp_path), full_page=True)
        await page.get_by_role("button", name="Approve").click()
        await expect(page.locator(".run-head")).to_contain_text("SUCCEEDED")
        await expect(page.locator(".wf-row[data-seq='2'] .wf-wait")).to_contain_text("waited")

        # Another worker resumed it after the wait: said plainly, not a takeover.
        await _sql(store, "UPDATE run_step SET worker = 'worker-B' WHERE run_id = %s AND seq >= 2", run_id)
        await page.reload()
        tool = page.locator(".wf-row[data-seq='2']")
        await expect(tool.locator(".tag.resumed")).to_contain_text("resumed on worker-B")
        await expect(page.locator(".tag.takeover")).to_have_count(0)
        # A tool call run again by another worker is a crash's takeover.
        await _sql(store, "UPDATE run_step SET attempts = 2 WHERE run_id = %s AND seq = 2", run_id)
        await page.reload()
        await expect(tool.locator(".tag.takeover")).to_contain_text("taken over by worker-B")


async def test_a_run_cancelled_while_waiting_is_abandoned_not_waiting_and_no_error(
    store: RunStore, page: Page, tmp_path: Path
) -> None:
    async with stack(store) as (url, http):
        GATE.set()
        run_id = await submit(http, requireApproval=["list_tickets"])
        await wait_status(http, run_id, "WAITING")
        await page.goto(f"{url}/ui/#/runs/{run_id}")
        await expect(page.locator(".decision")).to_contain_text("list_tickets")
        await page.get_by_role("button", name="Cancel run").click()
        await expect(page.locator(".run-head")).to_contain_text("CANCELLED")
        await expect(page.locator("#cancelled")).to_contain_text("Cancelled")
        await expect(page.locator("main [role=alert]")).to_have_count(0)  # no red "Error"
        await expect(page.locator("main")).not_to_contain_text("Error")
        await expect(page.locator(".wf-row[data-status='ABANDONED']")).to_have_count(1)
        await expect(page.locator(".conversation .abandoned")).to_contain_text("never decided")
        await expect(page.locator("main")).not_to_contain_text("waiting for a person's decision")
        await expect(page.locator(".pending")).to_have_count(0)
        await page.screenshot(path=shot("ui-cancelled-waiting.png", tmp_path), full_page=True)


async def test_an_unpriced_model_says_unpriced_and_icons_need_no_font(
    store: RunStore, page: Page
) -> None:
    async with stack(store) as (url, http):
        GATE.set()
        run_id = await submit(http, model="claude-unpriced-9")
        await wait_status(http, run_id, "SUCCEEDED")
        assert (await http.get(f"/api/runs/{run_id}")).json()["costUsd"] is None
        await page.goto(f"{url}/ui/")
        await expect(page.locator(f"tr[data-run='{run_id}'] .cost")).to_have_text("unpriced")
        await expect(page.locator("main")).not_to_contain_text("$0.0000")
        await page.goto(f"{url}/ui/#/runs/{run_id}")
        await expect(page.locator(".run-head")).to_contain_text("SUCCEEDED")
        await expect(page.locator(".wf-row[data-seq='1']")).to_contain_text("unpriced")
        # Every status icon is drawn by CSS: no glyph a font may lack.
        text = await page.locator("body").inner_text()
        assert not set(text) & set("⏸⌛⇄⊘"), text
        await expect(page.locator(".badge .ic").first).to_be_visible()
        # Found and measured in one task of the page: its late loads (a step's detail, decisions, forks) redraw
        # the page, and a handle found before a redraw measures as None (no box) once it is detached.
        box = await page.evaluate("() => document.querySelector('.badge .ic').getBoundingClientRect().toJSON()")
        assert box["width"] > 3 and box["height"] > 3, box
        # The run's own cost comes from the events stream's `run` event (RunView there too).
        async with http.stream("GET", f"/api/runs/{run_id}/events") as events:
            streamed = None
            lines = events.aiter_lines()
            async for line in lines:
                if line == "event: run":
                    streamed = json.loads((await anext(lines)).removeprefix("data: "))
                    break
        assert streamed is not None and streamed["costUsd"] is None
        await expect(page.locator("#run-cost")).to_have_text("unpriced")
        await expect(page.locator("main")).not_to_contain_text("$0.0000")


async def test_the_step_inspector_shows_a_steps_request_and_response_raw_and_downloads_it(
    store: RunStore, page: Page, tmp_path: Path
) -> None:
    async with stack(store) as (url, http):
        GATE.set()
        run_id = await submit(http)
        await wait_status(http, run_id, "SUCCEEDED")
        await page.goto(f"{url}/ui/#/runs/{run_id}")
        await page.get_by_role("button", name="Inspect step 1").click()
        inspector = page.locator("#inspector")
        await expect(inspector).to_contain_text("Step #1 · MODEL")
        await expect(inspector).to_contain_text("Request")
        await expect(inspector.locator(".insp-facts")).to_contain_text("cost")
        detail = (await http.get(f"/api/runs/{run_id}/steps/1")).json()
        assert detail["sent"] is not None
        await expect(inspector.locator(".part.tools")).to_contain_text("list_tickets")
        await expect(inspector.locator(".part.messages")).to_contain_text("Which acme tickets are overdue?")
        await expect(inspector.locator(".part.system")).to_be_visible()
        await expect(inspector.locator(".part.response")).to_contain_text("tool_use")
        await page.screenshot(path=shot("ui-inspector.png", tmp_path), full_page=True)

        await page.get_by_role("button", name="Inspect step 2").click()
        await expect(inspector.locator(".part.tool-input")).to_contain_text('"status": "overdue"')
        await expect(inspector.locator(".part.tool-output")).to_contain_text("ACME-101")
        await page.get_by_role("button", name="Raw JSON").click()
        raw = json.loads(await inspector.locator("#insp-json").inner_text())
        assert raw["seq"] == 2 and raw["kind"] == "TOOL"
        async with page.expect_download() as info:
            await page.get_by_role("button", name="Download JSON").click()
        download = await info.value
        assert download.suggested_filename == f"run-{run_id[:8]}-step-2.json"
        saved = tmp_path / "step.json"
        await download.save_as(saved)
        assert json.loads(saved.read_text())["toolName"] == "list_tickets"
        await page.get_by_role("button", name="Formatted").click()
        await expect(inspector.locator(".part.tool-output")).to_be_visible()
