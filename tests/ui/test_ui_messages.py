"""The message box on a running run's page, in a real headless Chromium: typed, sent, and seen arriving as a
USER step after the tool call in flight; the box is gone once the run has finished."""

from __future__ import annotations

from pathlib import Path

from agentrun.worker.store import RunStore
from tests.ui.test_ui import GATE, shot, stack, submit  # skips this module without Chromium or Playwright

from playwright.async_api import Page, expect  # isort: skip  (after test_ui's check that Playwright is there)


async def test_a_message_typed_on_a_running_runs_page_arrives_as_a_user_step(
    store: RunStore, page: Page, tmp_path: Path
) -> None:
    async with stack(store) as (url, http):
        run_id = await submit(http)
        await page.goto(f"{url}/ui/#/runs/{run_id}")
        # The tool is held: the run is between its model turn and the turn's result.
        await expect(page.locator(".wf-row[data-seq='2']")).to_have_attribute("data-status", "STARTED")
        box = page.get_by_label("Send a message")
        await box.fill("Also say which one is older.")
        await page.get_by_role("button", name="Send").click()
        await expect(page.locator("p.ok")).to_contain_text("Message: done")
        await expect(page.locator("#messages-waiting")).to_contain_text("1 message waiting for the next turn boundary")
        await expect(box).to_have_value("")
        await page.screenshot(path=shot("ui-message-sent.png", tmp_path), full_page=True)
        GATE.set()
        posted = page.locator(".conversation .msg.user.posted")
        await expect(posted).to_contain_text("Also say which one is older.")
        await expect(posted).to_contain_text("user · #3")
        await expect(page.locator(".run-head")).to_contain_text("SUCCEEDED")
        await expect(page.locator(".wf-row[data-seq='3']")).to_contain_text("user")
        await expect(page.locator(".wf-row[data-seq='3']")).to_contain_text("a user message")
        # In order: the tool's result, then the message, then the model's answer to both.
        kinds = await page.locator(".conversation > li").evaluate_all(
            "els => els.map(e => e.classList.contains('posted') ? 'message' : e.className.split(' ')[1])")
        assert kinds[-3:] == ["result", "message", "assistant"], kinds
        await expect(page.locator("#message-form")).to_have_count(0)  # a finished run takes none
        await page.screenshot(path=shot("ui-message.png", tmp_path), full_page=True)
    timeline = (await store.timeline(__import__("uuid").UUID(run_id)))
    assert [s.kind.value for s in timeline] == ["MODEL", "TOOL", "USER", "MODEL"]
