"""COMPACT steps and provider compaction on a run's page, in a real headless Chromium: each COMPACT step is
drawn as its own kind ("compacted: N steps summarised", "cleared N tool results"), never as a tool; a MODEL
step whose response opens with a compaction block is marked "compacted by the provider"."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import psycopg

from agentrun.worker.api.app import create_app
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.tools import ToolBox
from tests.support.builders import MODEL
from tests.ui.test_ui import serving  # skips this module without Chromium or Playwright

from playwright.async_api import Page, expect  # isort: skip  (after test_ui's check that Playwright is there)

SUMMARY = {"strategy": "summarize", "keepFromSeq": 7, "coversSeqs": [1, 6], "estimatedTokens": 170_000,
           "window": 200_000, "triggerTokens": 160_000}


async def test_compact_steps_are_drawn_as_their_own_kind(
    store: RunStore, db: psycopg.AsyncConnection[Any], page: Page
) -> None:
    app = create_app(store, ToolBox(), WorkerSettings(database_url="unused", default_model=MODEL), Metrics())
    async with serving(app) as url, httpx.AsyncClient(base_url=url) as http:
        r = await http.post("/api/runs", json={"input": "read the logs", "tokenBudget": 1000, "timeoutSeconds": 60})
        run_id = r.json()["id"]
        rows = [
            (1, "MODEL", '{"model": "m"}',
             orjson.dumps([{"type": "compaction", "content": "earlier"}, {"type": "text", "text": "hello"}]).decode()),
            (2, "COMPACT", orjson.dumps(SUMMARY).decode(), "The user asked to read the logs."),
            (3, "COMPACT", orjson.dumps({**SUMMARY, "strategy": "clear_tool_results", "coversSeqs": [2, 2]}).decode(),
             orjson.dumps([{"toolUseId": "t1", "tool": "lookup", "seq": 2}]).decode()),
        ]
        for seq, kind, request, response in rows:
            await db.execute("INSERT INTO run_step (run_id, seq, kind, status, request, response, started_at, "
                             "finished_at) VALUES (%s, %s, %s, 'DONE', %s, %s, now(), now())",
                             (run_id, seq, kind, request, response))
        await db.execute("UPDATE run SET status = 'SUCCEEDED', finished_at = now(), output = to_jsonb('ok'::text) "
                         "WHERE id = %s", (run_id,))
        await page.goto(f"{url}/ui/#/runs/{run_id}")
        waterfall = page.locator(".waterfall")
        await expect(waterfall.locator(".wf-row[data-seq='2']")).to_contain_text("compacted: 6 steps summarised")
        await expect(waterfall.locator(".wf-row[data-seq='3']")).to_contain_text("compacted: cleared 1 tool result")
        await expect(waterfall.locator(".wf-row[data-seq='1']")).to_contain_text("compacted by the provider")
        await expect(waterfall).not_to_contain_text("tool · null")
        conversation = page.locator(".conversation")
        await expect(conversation).to_contain_text("The user asked to read the logs.")
        await expect(conversation.locator(".msg.compact[data-seq='1']")).to_contain_text("compacted by the provider")
        await page.screenshot(path="/tmp/ui-context.png", full_page=True)
