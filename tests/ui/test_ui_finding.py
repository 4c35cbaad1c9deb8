"""Finding runs in a real headless Chromium (issue 29): the runs list's filters (kept in the address), paging
past the newest 100, sortable columns, end time and duration, labels; several runs cancelled at once; the
new-run form's model, tools, approvals, output schema, timeout and labels; fork and continue with other
settings; a source linking to its forks; the workers page."""

from __future__ import annotations

import re
from pathlib import Path

from agentrun.worker.store import RunStore
from tests.support.builders import new_run
from tests.ui.test_ui import (  # skips this module without Chromium or Playwright
    GATE,
    Page,
    app_for,
    expect,
    serving,
    shot,
    stack,
    submit,
    wait_status,
)


async def test_runs_made_within_one_millisecond_list_newest_first_both_ways(store: RunStore, page: Page) -> None:
    """createdAt reaches the page in milliseconds: runs made within one (the submit path batches them) tie
    there, and the list must keep the server's order for them, newest first, or oldest first when asked."""
    made = [(await store.create(new_run(f"tied {i}")))[0].id for i in range(3)]
    async with store.pool.connection() as conn:  # one millisecond, microseconds apart, in the order made
        for i, run_id in enumerate(made):
            await conn.execute("UPDATE run SET created_at = '2026-12-05T10:00:00.123000Z'::timestamptz "
                               "+ make_interval(secs => %s * 0.0001) WHERE id = %s", (i, run_id))
    async with serving(app_for(store)) as url:
        await page.goto(f"{url}/ui/")
        rows = page.locator("tbody tr")
        await expect(rows).to_have_count(3)
        for i, run_id in enumerate(reversed(made)):
            await expect(rows.nth(i)).to_have_attribute("data-run", str(run_id))
        await page.locator("button.sort[data-col=Created]").click()  # oldest first
        for i, run_id in enumerate(made):
            await expect(rows.nth(i)).to_have_attribute("data-run", str(run_id))


async def test_the_list_pages_past_the_newest_100_sorts_and_cancels_several(
    store: RunStore, page: Page
) -> None:
    made = [(await store.create(new_run(f"run {i:03}")))[0].id for i in range(105)]
    async with serving(app_for(store)) as url:  # no worker: they stay QUEUED
        await page.goto(f"{url}/ui/")
        rows = page.locator("tbody tr")
        await expect(rows).to_have_count(100)
        await expect(rows.first).to_have_attribute("data-run", str(made[-1]))  # newest first
        await expect(page.locator("#list-info")).to_contain_text("more below")
        await page.get_by_role("button", name="Load older runs").click()
        await expect(rows).to_have_count(105)
        await expect(page.locator("#load-more")).to_be_hidden()

        # Sortable columns, over the loaded rows.
        await page.locator("th button.sort[data-col='Input']").click()
        await expect(rows.first).to_contain_text("run 000")
        await expect(page.locator("th[aria-sort='ascending']")).to_contain_text("Input")
        await page.locator("th button.sort[data-col='Input']").click()
        await expect(rows.first).to_contain_text("run 104")

        # The status filter (kept in the address), then several runs cancelled at once.
        await page.fill("#f-status", "QUEUED")
        await page.get_by_role("button", name="Filter", exact=True).click()
        # The address changes on the page's hashchange, which reaches Playwright after the click returns.
        await expect(page).to_have_url(re.compile(r"[?&]status=QUEUED\b"))
        await expect(rows).to_have_count(100)
        # The live refresh leaves unchanged rows in place (a redraw under a click would lose it).
        box = await page.get_by_role("checkbox", name=f"select run {str(made[-1])[:8]}").element_handle()
        for _ in range(2):  # the second is wholly after the first was drawn
            async with page.expect_response(lambda r: "/api/runs?" in r.url and r.request.method == "GET"):
                pass
        assert await box.evaluate("e => e.isConnected")
        await page.get_by_role("checkbox", name=f"select run {str(made[-1])[:8]}").check()
        await page.get_by_role("checkbox", name=f"select run {str(made[-2])[:8]}").check()
        await page.get_by_role("button", name="Cancel selected (2)").click()
        await expect(page.locator("#bulk-info")).to_contain_text("Cancel asked for 2 runs")
        for run_id in made[-2:]:
            got = await store.get(run_id)
            assert got is not None and got.status.value == "CANCELLED"
        await expect(page.locator(f"tr[data-run='{made[-1]}']")).to_have_count(0)  # no longer QUEUED


async def test_the_new_run_form_sends_model_tools_approvals_schema_and_timeout(
    store: RunStore, page: Page
) -> None:
    async with stack(store) as (url, http):
        await page.goto(f"{url}/ui/")
        await page.fill("#new-input", "Which acme tickets are overdue?")
        await page.fill("#new-model", "claude-sonnet-4-5")
        await page.fill("#new-budget", "20000")
        await page.fill("#new-timeout", "120")
        await page.fill("#new-tools", "list_tickets")
        await page.fill("#new-approval", "list_tickets")
        await page.fill("#new-schema", '{"type": "object", "properties": {"overdue": {"type": "array"}}}')
        await page.get_by_role("button", name="Submit run").click()
        await expect(page.locator(".run-head")).to_contain_text("WAITING")
        run = (await http.get(f"/api/runs/{page.url.rsplit('/', 1)[-1]}")).json()
        assert run["model"] == "claude-sonnet-4-5" and run["tokenBudget"] == 20_000 and run["timeoutSeconds"] == 120
        assert run["tools"] == ["list_tickets"] and run["requireApproval"] == ["list_tickets"]
        assert run["outputSchema"] == {"type": "object", "properties": {"overdue": {"type": "array"}}}

        # A schema that is not JSON is refused on the page, naming the field.
        await page.goto(f"{url}/ui/")
        await page.fill("#new-input", "x")
        await page.fill("#new-schema", "{not json")
        await page.get_by_role("button", name="Submit run").click()
        await expect(page.locator("#new-error")).to_contain_text("outputSchema")


async def test_fork_with_other_settings_and_the_source_links_to_its_fork(
    store: RunStore, page: Page
) -> None:
    async with stack(store) as (url, http):
        GATE.set()
        source = await submit(http)
        await wait_status(http, source, "SUCCEEDED")
        await page.goto(f"{url}/ui/#/runs/{source}")
        await expect(page.locator(".run-head")).to_contain_text("SUCCEEDED")
        await page.locator("#run-options summary").click()
        await page.fill("#opt-tokenBudget", "40000")
        await page.fill("#opt-timeoutSeconds", "120")
        await page.fill("#opt-maxSteps", "20")
        await page.get_by_role("button", name="Fork from step 1").click()
        await expect(page.get_by_text("From run")).to_contain_text("at step 1")
        fork = page.url.rsplit("/", 1)[-1]
        got = (await http.get(f"/api/runs/{fork}")).json()
        assert (got["tokenBudget"], got["timeoutSeconds"], got["maxSteps"]) == (40_000, 120, 20)
        await expect(page.locator("#parent-link")).to_have_attribute("href", f"#/runs/{source}")
        await wait_status(http, fork, "SUCCEEDED")
        # The source links to the fork.
        await page.goto(f"{url}/ui/#/runs/{source}")
        await expect(page.locator(f"#descendants a[data-run='{fork}']")).to_be_visible()
        await page.locator(f"#descendants a[data-run='{fork}']").click()
        await expect(page.locator("#parent-link")).to_be_visible()


async def test_the_list_shows_end_time_and_duration(store: RunStore, page: Page) -> None:
    async with stack(store) as (url, http):
        GATE.set()
        run_id = await submit(http)
        await wait_status(http, run_id, "SUCCEEDED")
        await page.goto(f"{url}/ui/")
        row = page.locator(f"tr[data-run='{run_id}']")
        await expect(row.locator(".duration")).to_contain_text("s")
        await expect(row.locator(".ended")).not_to_have_text("–")


async def test_labels_and_the_other_filters_narrow_the_list(store: RunStore, page: Page, tmp_path: Path) -> None:
    async with stack(store) as (url, http):
        GATE.set()
        billing = await submit(http, "Which billing tickets are overdue?", labels={"team": "billing", "env": "dev"})
        support = await submit(http, "Which support tickets are open?", labels={"team": "support"})
        await wait_status(http, billing, "SUCCEEDED")
        await wait_status(http, support, "SUCCEEDED")
        await page.goto(f"{url}/ui/")
        row = page.locator(f"tr[data-run='{billing}']")
        await expect(row.locator(".tag.label")).to_have_text(["env=dev", "team=billing"])
        await page.screenshot(path=shot("ui-runs-labels.png", tmp_path), full_page=True)

        await page.fill("#f-labelSelector", "team=billing,env!=prod")
        await page.keyboard.press("Enter")
        rows = page.locator("tbody tr")
        await expect(rows).to_have_count(1)
        await expect(rows.first).to_have_attribute("data-run", billing)
        await page.get_by_role("button", name="Clear").click()
        await expect(rows).to_have_count(2)
        await page.fill("#f-q", "SUPPORT")
        await page.keyboard.press("Enter")
        await expect(rows).to_have_count(1)
        await expect(rows.first).to_have_attribute("data-run", support)
        # A bad selector is the API's 422, said on the page.
        await page.goto(f"{url}/ui/#/?labelSelector=team%20in%20(")
        await expect(page.locator("#list-info")).to_contain_text("labelSelector")
        # A created range after both runs finds none.
        await page.goto(f"{url}/ui/#/?createdAfter=2999-01-01T00:00:00.000Z")
        await expect(page.locator("#list-info")).to_contain_text("No run matches these filters.")
        await expect(page.locator("#f-createdAfter")).not_to_have_value("")

        await page.goto(f"{url}/ui/#/runs/{billing}")
        await expect(page.locator("#run-labels")).to_contain_text("team=billing")


async def test_the_workers_page_lists_the_live_workers(store: RunStore, page: Page, tmp_path: Path) -> None:
    async with stack(store) as (url, http):
        GATE.set()
        await wait_status(http, await submit(http), "SUCCEEDED")  # the worker is at work, so present
        await page.goto(f"{url}/ui/")
        await page.get_by_role("link", name="Workers").click()
        row = page.locator("tr[data-worker='worker-A']")
        await expect(row).to_be_visible()
        await expect(row).to_contain_text("ago")
        listed = (await http.get("/api/workers")).json()["items"]
        assert [w["id"] for w in listed] == ["worker-A"]
        await expect(page.locator("tbody tr")).to_have_count(1)
        await page.screenshot(path=shot("ui-workers.png", tmp_path), full_page=True)
