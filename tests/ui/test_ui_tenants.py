"""Tenants in a real headless Chromium: the page names the caller's tenant and lists only its runs; a platform
operator's identity sees every tenant's, each run naming its tenant, and filters by tenant."""

from __future__ import annotations

from pathlib import Path

from agentrun.worker.store import RunStore
from tests.support.builders import new_run
from tests.support.tenants import token_of, write_identities
from tests.ui.test_ui import shot, stack  # skips this module without Chromium or Playwright

from playwright.async_api import Page, expect  # isort: skip  (after test_ui's check that Playwright is there)


async def test_the_page_shows_the_callers_tenant_and_only_its_runs(
    store: RunStore, page: Page, tmp_path: Path,
) -> None:
    a, _ = await store.create(new_run("team a's run", tenant="team-a"))
    b, _ = await store.create(new_run("team b's run", tenant="team-b"))
    tokens = write_identities(tmp_path / "tokens.json")
    async with stack(store, tokens_file=str(tokens)) as (url, _):
        await page.add_init_script(
            f"if (!sessionStorage.getItem('agentrun.token')) sessionStorage.setItem('agentrun.token', '{token_of('carol')}')")
        await page.goto(f"{url}/ui/")
        await expect(page.locator("#me")).to_have_text("carol · tenant team-a · read")
        await expect(page.locator(f"tr[data-run='{a.id}']")).to_be_visible()
        await expect(page.locator(f"tr[data-run='{b.id}']")).to_have_count(0)
        await expect(page.locator("#f-tenant")).to_have_count(0)  # nothing to filter: it sees one tenant
        await page.screenshot(path=shot("ui-tenant.png", tmp_path), full_page=True)
        await page.goto(f"{url}/ui/#/runs/{a.id}")
        await expect(page.locator("#run-tenant")).to_have_text("team-a")
        await page.goto(f"{url}/ui/#/runs/{b.id}")
        await expect(page.get_by_text("no run")).to_be_visible()

        # A platform operator's identity: every tenant's runs, each naming its tenant, and a tenant filter.
        await page.evaluate(f"sessionStorage.setItem('agentrun.token', '{token_of('root')}')")
        await page.goto(f"{url}/ui/")
        await page.reload()
        await expect(page.locator("#me")).to_contain_text("root · all tenants")
        await expect(page.locator(f"tr[data-run='{b.id}'] .tenant")).to_have_text("team-b")
        await expect(page.locator(f"tr[data-run='{a.id}']")).to_be_visible()
        await page.fill("#f-tenant", "team-b")
        await page.click("#apply-filters")
        await expect(page.locator(f"tr[data-run='{a.id}']")).to_have_count(0)
        await expect(page.locator(f"tr[data-run='{b.id}']")).to_be_visible()
        await page.screenshot(path=shot("ui-tenants-all.png", tmp_path), full_page=True)
