"""An MCP tool's progress on its run's page, in a real headless Chromium: the `progress` events of a long
call show as a bar with the server's message while it works, and go once its result is in."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import pytest

from agentrun.worker.core.records import RunStatus
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolBox
from tests.mcp.server import HttpServer
from tests.support.api import make_app
from tests.support.builders import MODEL, new_run, worker
from tests.support.mcp import sessions
from tests.ui.test_ui import serving  # skips this module without Chromium or Playwright

from playwright.async_api import Page, expect  # isort: skip  (after test_ui's check that Playwright is there)


@pytest.fixture
def http_server() -> Iterator[HttpServer]:
    with HttpServer() as server:
        yield server


async def test_a_long_mcp_call_shows_its_progress_until_its_result(
    store: RunStore, http_server: HttpServer, page: Page
) -> None:
    # Long enough for a loaded machine's browser to see it at work; progress keeps it under the idle timeout.
    servers = {"name": "shop", "url": http_server.url, "timeoutSeconds": 5, "maxTimeoutSeconds": 120}
    async with sessions(servers) as mcp:
        box = ToolBox(sources=mcp.servers)
        run, _ = await store.create(new_run(tools=("shop__slow",)))
        llm = (ScriptedLlm().then_tool_uses([("toolu_slow", "shop__slow", {"seconds": 12, "every": 0.3})])
               .then_text("worked"))
        app = make_app(store, box, WorkerSettings(database_url="unused", default_model=MODEL), Metrics(cache_seconds=0))
        async with serving(app) as url:
            await page.goto(f"{url}/ui/#/runs/{run.id}")
            await expect(page.locator(".run-head")).to_contain_text("QUEUED")
            driving = asyncio.create_task(worker(store, llm, box).run_once())
            try:
                bar = page.locator("#progress .tool-progress[data-tool-use='toolu_slow']")
                await expect(bar).to_contain_text("shop__slow", timeout=30_000)
                await expect(bar).to_contain_text(" of 40")
                await expect(bar.locator(".progress-message")).to_contain_text("step ")
                await expect(bar.locator(".meter .fill")).to_have_attribute("style", re.compile(r"width:\d+(\.\d)?%"))
                await expect(page.locator(".run-head")).to_contain_text("SUCCEEDED", timeout=90_000)
                await expect(page.locator("#progress")).to_have_count(0)
            finally:
                await asyncio.wait_for(driving, 90)
    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.SUCCEEDED

