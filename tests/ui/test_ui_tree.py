"""The tree of sub-agent runs in the web UI, in a real headless Chromium: a planner with two children,
its page waiting for its sub-agents, then listing them (status, agent, tokens, cost, links) with its
totals; a child's page linking back to the parent and the call that started it."""

from __future__ import annotations

import os
from pathlib import Path

from agentrun.worker.store import RunStore
from tests.support.running import finished
from tests.support.trees import child_ids, tree_at_work

# Playwright's names, through the module that skips itself without Chromium or Playwright.
from tests.ui.test_ui import Page, app_for, expect, serving

SHOTS = Path(os.environ.get("AGENTRUN_UI_TREE_SHOTS", "/tmp"))


async def test_a_parent_lists_its_children_and_a_child_links_to_its_parent(
    store: RunStore, page: Page
) -> None:
    async with serving(app_for(store)) as url, tree_at_work(store, "researcher", "writer") as (parent, hold):
        ids = await child_ids(store, parent.id)
        await page.goto(f"{url}/ui/#/runs/{parent.id}")
        tree = page.locator("#children")
        await expect(tree.locator(".waiting-children")).to_contain_text("Waiting for its sub-agents: 2 of 2 at work")
        await expect(tree.locator("tbody tr")).to_have_count(2)
        # A sub-agent call takes no decision: the decisions card does not offer any.
        await expect(page.locator(".pending")).to_have_count(0)
        await page.screenshot(path=str(SHOTS / "agentrun-tree-waiting.png"), full_page=True)

        hold.set()
        done = await finished(store, parent.id, 60)
        assert done.status.value == "SUCCEEDED", done.error
        await expect(page.locator(".head-status")).to_contain_text("SUCCEEDED")
        await expect(tree.locator(".waiting-children")).to_have_count(0)
        rows = tree.locator("tbody tr")
        await expect(rows).to_have_count(2)
        for i, (child_id, call) in enumerate(zip(ids, ["toolu_0_agent__researcher", "toolu_1_agent__writer"],
                                                 strict=True)):
            row = rows.nth(i)
            await expect(row).to_have_attribute("data-run", child_id)
            await expect(row).to_have_attribute("data-call", call)
            await expect(row).to_contain_text("SUCCEEDED")
            await expect(row.locator("a")).to_have_attribute("href", f"#/runs/{child_id}")
        children = await store.children(parent.id)
        await expect(rows.nth(0).locator("td.num").nth(0)).to_have_text(f"{children[0].tokens_used_total:,}")
        await expect(page.locator("#totals")).to_contain_text(f"{done.tokens_used_total:,} tokens")
        await expect(page.locator("#totals")).to_contain_text(f"own: {done.tokens_used:,} tokens")
        await page.screenshot(path=str(SHOTS / "agentrun-tree-parent.png"), full_page=True)

        await rows.nth(1).locator("a").click()
        await expect(page).to_have_url(f"{url}/ui/#/runs/{ids[1]}")
        started = page.locator("#started-by")
        await expect(started).to_contain_text("Started by run")
        await expect(started).to_contain_text("for call toolu_1_agent__writer")
        await expect(page.locator("#children")).to_have_count(0)  # a leaf lists no children
        await page.screenshot(path=str(SHOTS / "agentrun-tree-child.png"), full_page=True)
        await page.locator("#parent-link").click()
        await expect(page).to_have_url(f"{url}/ui/#/runs/{parent.id}")
        await expect(page.locator("#children tbody tr")).to_have_count(2)
