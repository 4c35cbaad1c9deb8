"""What a run waits for, on its page in a real headless Chromium: a timer's wake time; an event's key and
timeout, gone once the event is posted and the run goes on."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import AsyncIterator
from typing import Any

import httpx

from agentrun.worker.api.app import create_app
from agentrun.worker.llm.anthropic_client import AnthropicClient
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.testing.fake_server import AgentResponder, FakeAnthropic, Reply
from agentrun.worker.tools import ToolBox
from tests.support.builders import MODEL, worker
from tests.ui.test_ui import serving  # skips this module without Chromium or Playwright

from playwright.async_api import Page, expect  # isort: skip  (after test_ui's check that Playwright is there)


def responder(body: dict[str, Any]) -> Reply:
    offered = {t.get("name") for t in body.get("tools", [])}
    if "wait_for_event" in offered:
        return AgentResponder("wait_for_event", {"key": "invoice:77", "timeoutSeconds": 900})(body)
    return AgentResponder("wait", {"seconds": 7200})(body)


@contextlib.asynccontextmanager
async def stack(store: RunStore) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    async with FakeAnthropic(responder) as model:
        llm = AnthropicClient(api_key="test-key", base_url=model.base_url, http_timeout=60)
        w = worker(store, llm, poll=0.05)
        task = asyncio.create_task(w.run())
        app = create_app(store, ToolBox(), WorkerSettings(database_url="unused", default_model=MODEL), Metrics())
        try:
            async with serving(app) as url, httpx.AsyncClient(base_url=url) as http:
                yield url, http
        finally:
            w.stop()
            await asyncio.wait_for(task, 60)
            await llm.aclose()


async def _submit(http: httpx.AsyncClient, tools: list[str]) -> str:
    r = await http.post("/api/runs", json={"input": "pay it", "tokenBudget": 50_000, "timeoutSeconds": 86_400,
                                           "tools": tools})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def test_the_run_page_shows_a_timers_wake_time_and_an_events_key_and_timeout(
    store: RunStore, page: Page
) -> None:
    async with stack(store) as (url, http):
        sleeper = await _submit(http, ["wait"])
        await page.goto(f"{url}/ui/#/runs/{sleeper}")
        waits = page.locator("#waits")
        await expect(waits).to_contain_text("Waiting for a timer")
        wake = page.locator("#waits .wait[data-kind='timer'] .wake-at")
        await expect(wake).to_contain_text("in 2h")
        at = datetime.datetime.fromisoformat(await wake.get_attribute("data-at") or "")
        assert at > datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=7000)
        await expect(page.locator(".pending")).to_have_count(0)  # no decision is asked of anyone

        waiter = await _submit(http, ["wait_for_event"])
        await page.goto(f"{url}/ui/#/runs/{waiter}")
        await expect(waits).to_contain_text("Waiting for an event")
        await expect(page.locator("#waits .event-key")).to_have_text("invoice:77")
        await expect(page.locator("#waits .timeout-at")).to_contain_text("in 15m")
        r = await http.post("/api/events", json={"key": "invoice:77", "payload": {"paid": True}})
        assert r.json() == {"woke": [waiter]}
        await expect(page.locator(".run-head")).to_contain_text("SUCCEEDED")
        await expect(waits).to_have_count(0)
        await expect(page.locator(".conversation")).to_contain_text('{"paid":true}')
        assert (await http.post(f"/api/runs/{sleeper}/cancel")).status_code == 202
