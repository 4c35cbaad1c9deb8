"""The web UI at /ui/ in a real headless Chromium (Debian's `chromium`, driven by Playwright): the runs list,
a run's steps and conversation, live updates of a running run, cancel and approve from the page, and the
token prompt. Skipped, saying why, without Chromium or Playwright, except in CI (CI=true), where that fails.

Screenshots of the list and of a run's page are written to docs/ when AGENTRUN_UI_SCREENSHOTS=1
(`make screenshots`), else to the test's temporary directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from agentrun.worker.api.app import create_app
from agentrun.worker.llm.anthropic_client import AnthropicClient
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.testing.fake_server import AgentResponder, FakeAnthropic, Reply
from agentrun.worker.tools import ToolBox, ToolContext, tool
from tests.support.builders import MODEL, worker
from tests.support.serving import serving
from tests.ui import chromium

DOCS = Path(__file__).resolve().parents[2] / "docs"


if (why := chromium.missing()) is not None:
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"the browser tests cannot run in CI: {why}")
    pytest.skip(why, allow_module_level=True)

from playwright.async_api import Page, expect  # noqa: E402


class Gate:
    """An asyncio.Event of whichever event loop runs now: an Event is bound to the first loop that waits on
    it, and the browser tests share the session's loop (tests/ui/conftest.py) while any other test that
    drives this tool has a loop of its own (a wait on another loop's Event would raise inside the tool)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event = asyncio.Event()

    def _now(self) -> asyncio.Event:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._event = loop, asyncio.Event()
        return self._event

    def set(self) -> None:
        self._now().set()

    def clear(self) -> None:
        self._now().clear()

    async def wait(self) -> None:
        await self._now().wait()


GATE = Gate()  # the tool waits on it: a run held in its tool step for as long as a test wants


@tool(name="list_tickets", description="List acme tickets by status.",
      input_schema={"type": "object", "properties": {"status": {"type": "string"}}})
async def list_tickets(args: dict[str, Any], ctx: ToolContext) -> str:
    await GATE.wait()
    return '[{"id": "ACME-101", "title": "Invoice PDF renders blank", "due": "2026-11-22"}, ' \
           '{"id": "ACME-102", "title": "SSO login loops on Safari", "due": "2026-11-28"}]'


ANSWER = ("Two acme tickets are overdue: ACME-101 (Invoice PDF renders blank, due 22 November) and "
          "ACME-102 (SSO login loops on Safari, due 28 November). Both are still open.")


def responder(body: dict[str, Any]) -> Reply:
    reply = AgentResponder("list_tickets", {"status": "overdue"})(body)
    if reply.body.get("stop_reason") == "end_turn":
        reply = Reply.text(ANSWER, reply.body["usage"])
    return reply


def slowly(body: dict[str, Any]) -> Reply:
    """The same replies with the answer's words 0.12 s apart (about 4 s): long enough for a page to show it
    streaming. Only the test that watches text stream in needs it; the others would wait it out per run."""
    return responder(body).streamed_slowly(0.12)


def app_for(store: RunStore, token: str | None = None, tokens_file: str | None = None) -> FastAPI:
    settings = WorkerSettings(database_url="unused", worker_id="ui-test", default_model=MODEL, api_token=token,
                              api_tokens_file=tokens_file)
    return create_app(store, ToolBox([list_tickets]), settings, Metrics())


@contextlib.asynccontextmanager
async def stack(
    store: RunStore, token: str | None = None, tokens_file: str | None = None,
    replies: Callable[[dict[str, Any]], Reply] = responder,
) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    """The API and UI served over real HTTP, a worker driving runs with the real SDK against the local
    Messages API server (streaming `replies`), and an HTTP client for the test's own requests."""
    GATE.clear()
    async with FakeAnthropic(replies) as model:
        llm = AnthropicClient(api_key="test-key", base_url=model.base_url, http_timeout=60)
        w = worker(store, llm, [list_tickets], name="worker-A", poll=0.05)
        task = asyncio.create_task(w.run())
        app = app_for(store, token, tokens_file)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            async with serving(app) as url, httpx.AsyncClient(base_url=url, headers=headers) as http:
                yield url, http
        finally:
            GATE.set()
            w.stop()
            await task
            await llm.aclose()


def shot(name: str, tmp_path: Path) -> Path:
    return (DOCS if os.environ.get("AGENTRUN_UI_SCREENSHOTS") == "1" else tmp_path) / name


async def submit(http: httpx.AsyncClient, text: str = "Which acme tickets are overdue?", **extra: Any) -> str:
    r = await http.post("/api/runs", json={"input": text, "tokenBudget": 50_000, "timeoutSeconds": 300, **extra})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def wait_status(http: httpx.AsyncClient, run_id: str, status: str) -> None:
    async with asyncio.timeout(60):
        while (await http.get(f"/api/runs/{run_id}")).json()["status"] != status:
            await asyncio.sleep(0.05)


async def test_the_list_shows_runs_and_a_run_page_its_steps_and_conversation(
    store: RunStore, page: Page, tmp_path: Path
) -> None:
    async with stack(store) as (url, http):
        GATE.set()
        done = await submit(http)
        await wait_status(http, done, "SUCCEEDED")
        queued = await submit(http, "Close the tickets fixed in release 4.2", tools=[])  # stays in the list too
        await wait_status(http, queued, "SUCCEEDED")

        await page.goto(f"{url}/ui/")
        row = page.locator(f"tr[data-run='{done}']")
        await expect(row).to_contain_text("SUCCEEDED")
        await expect(row).to_contain_text("Which acme tickets are overdue?")
        await expect(row).to_contain_text("worker-A")
        await expect(page.locator("tbody tr")).to_have_count(2)
        first = page.locator("tbody tr").first
        await expect(first).to_have_attribute("data-run", queued)  # newest first
        await page.screenshot(path=shot("ui-runs.png", tmp_path), full_page=True)

        # The status filter, by keyboard (any case, as the API takes it).
        await page.fill("#f-status", "failed")
        await page.keyboard.press("Enter")
        await expect(page.locator("#list-info")).to_contain_text("No run matches these filters.")
        await expect(page.locator("tbody tr")).to_have_count(0)
        await page.get_by_role("button", name="Clear").click()
        await expect(page.locator("tbody tr")).to_have_count(2)

        await row.get_by_role("link").click()
        await expect(page.locator(".run-head")).to_contain_text("SUCCEEDED")
        steps = page.locator(".wf-row")
        await expect(steps).to_have_count(3)
        await expect(steps.nth(0)).to_contain_text("model · tool_use")
        await expect(steps.nth(1)).to_contain_text("tool · list_tickets")
        await expect(steps.nth(2)).to_contain_text("model · end_turn")
        await expect(steps.nth(0)).to_contain_text("worker-A")
        convo = page.locator(".conversation")
        await expect(convo.locator(".msg.user")).to_contain_text("Which acme tickets are overdue?")
        await expect(convo.locator(".msg.call")).to_contain_text('"status": "overdue"')
        await expect(convo.locator(".msg.result")).to_contain_text("ACME-101")
        await expect(convo.locator(".msg.assistant").last).to_contain_text("Both are still open.")
        await expect(page.get_by_role("meter", name="Tokens")).to_be_visible()
        await page.screenshot(path=shot("ui-run.png", tmp_path), full_page=True)


async def test_a_running_runs_page_updates_live_and_cancel_works(store: RunStore, page: Page, tmp_path: Path) -> None:
    async with stack(store, replies=slowly) as (url, http):
        run_id = await submit(http)
        await page.goto(f"{url}/ui/#/runs/{run_id}")
        # The tool is held: its step shows as running, live, without a reload.
        await expect(page.locator(".wf-row[data-seq='2']")).to_have_attribute("data-status", "STARTED")
        await expect(page.locator(".run-head")).to_contain_text("RUNNING")
        await expect(page.locator(".msg.result")).to_contain_text("running…")
        GATE.set()
        # The final answer streams in before its step is written...
        await expect(page.locator(".msg.streaming")).to_contain_text("Two acme tickets")
        await page.screenshot(path=shot("ui-live.png", tmp_path), full_page=True)
        # ...then the step and the run's end arrive.
        await expect(page.locator(".wf-row")).to_have_count(3)
        await expect(page.locator(".run-head")).to_contain_text("SUCCEEDED")
        await expect(page.locator(".msg.streaming")).to_have_count(0)
        await expect(page.locator(".msg.assistant").last).to_contain_text("Both are still open.")

        GATE.clear()
        second = await submit(http)
        await page.goto(f"{url}/ui/#/runs/{second}")
        await expect(page.locator(".wf-row[data-seq='2']")).to_have_attribute("data-status", "STARTED")
        await page.get_by_role("button", name="Cancel run").click()
        await expect(page.locator(".run-head")).to_contain_text("CANCELLED")
        await expect(page.locator(".wf-row[data-seq='2']")).to_have_attribute("data-status", "ERROR")
        assert (await http.get(f"/api/runs/{second}")).json()["status"] == "CANCELLED"


async def test_approve_from_the_page(store: RunStore, page: Page) -> None:
    async with stack(store) as (url, http):
        r = await http.post("/api/runs", json={"input": "x", "tokenBudget": 1000, "timeoutSeconds": 60,
                                               "requireApproval": ["list_tickets"]})
        assert r.status_code == 201, r.text
        run_id = r.json()["id"]
        GATE.set()
        await wait_status(http, run_id, "WAITING")
        await page.goto(f"{url}/ui/#/runs/{run_id}")
        decision = page.locator(".decision")
        await expect(decision).to_contain_text("list_tickets")
        await decision.get_by_role("button", name="Approve").click()
        await expect(page.locator(".run-head")).to_contain_text("SUCCEEDED")
        assert (await http.get(f"/api/runs/{run_id}")).json()["status"] == "SUCCEEDED"


async def test_the_page_asks_for_the_token_when_the_api_has_one(store: RunStore, page: Page) -> None:
    async with stack(store, token="t0ken-for-the-ui") as (url, http):
        GATE.set()
        run_id = await submit(http)
        await page.goto(f"{url}/ui/")
        dialog = page.get_by_role("dialog", name="API token")
        await expect(dialog).to_be_visible()
        await page.fill("#token-input", "wrong")
        await page.keyboard.press("Enter")
        await expect(page.locator("#token-error")).to_contain_text("refused")
        await page.fill("#token-input", "t0ken-for-the-ui")
        await page.keyboard.press("Enter")
        await expect(dialog).to_be_hidden()
        await expect(page.locator(f"tr[data-run='{run_id}']")).to_be_visible()
        assert await page.evaluate("sessionStorage.getItem('agentrun.token')") == "t0ken-for-the-ui"
        assert "t0ken" not in page.url and await page.context.cookies() == []
        # The run's page streams with the same token (no second prompt).
        await page.goto(f"{url}/ui/#/runs/{run_id}")
        await expect(page.locator(".run-head")).to_contain_text("SUCCEEDED")
        await expect(dialog).to_be_hidden()


async def test_without_a_token_no_prompt_and_an_unknown_run_says_so(store: RunStore, page: Page) -> None:
    async with stack(store) as (url, _):
        await page.goto(f"{url}/ui/#/runs/00000000-0000-4000-8000-000000000000")
        await expect(page.get_by_role("alert")).to_contain_text("No run with id")
        await expect(page.get_by_role("dialog", name="API token")).to_be_hidden()
        await page.goto(f"{url}/ui/")
        await expect(page.locator(".muted[role=status]")).to_contain_text("No runs yet")


async def test_fork_and_continue_from_the_page(store: RunStore, page: Page) -> None:
    async with stack(store) as (url, http):
        GATE.set()
        source = await submit(http)
        await wait_status(http, source, "SUCCEEDED")
        await page.goto(f"{url}/ui/#/runs/{source}")
        await expect(page.locator(".run-head")).to_contain_text("SUCCEEDED")
        await page.get_by_role("button", name="Fork from step 1").click()
        await expect(page.locator(".run-head")).not_to_contain_text(source[:8])
        await expect(page.get_by_text("From run")).to_contain_text("at step 1")
        await expect(page.locator(".run-head")).to_contain_text("SUCCEEDED")
        fork = page.url.rsplit("/", 1)[-1]
        assert (await http.get(f"/api/runs/{fork}")).json()["parentRunId"] == source

        await page.goto(f"{url}/ui/#/runs/{source}")
        await page.fill("#continue-input", "And which are due this week?")
        await page.get_by_role("button", name="Continue", exact=True).click()
        await expect(page.get_by_text("From run")).to_be_visible()
        await expect(page.locator(".conversation")).to_contain_text("And which are due this week?")
        await expect(page.locator(".run-head")).to_contain_text("SUCCEEDED")


async def test_the_page_shows_who_you_are_and_hides_what_you_may_not_do(
    store: RunStore, page: Page, tmp_path: Path
) -> None:
    """A read-only identity sees runs and their pending calls, and no control its scopes do not allow."""
    import hashlib
    import json

    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"identities": [
        {"name": "reader", "sha256": hashlib.sha256(b"reader-token-1").hexdigest(), "scopes": ["read"]},
    ]}))
    async with stack(store, token="admin-token-1", tokens_file=str(tokens)) as (url, http):
        waiting = await submit(http, requireApproval=["list_tickets"])
        await wait_status(http, waiting, "WAITING")
        await page.add_init_script(
            "if (!sessionStorage.getItem('agentrun.token')) sessionStorage.setItem('agentrun.token', 'reader-token-1')"
        )
        await page.goto(f"{url}/ui/")
        await expect(page.locator("#me")).to_have_text("reader · tenant default · read")
        await expect(page.locator(f"tr[data-run='{waiting}']")).to_be_visible()
        await expect(page.locator("#new-input")).to_have_count(0)  # no submit form without `submit`
        await page.goto(f"{url}/ui/#/runs/{waiting}")
        await expect(page.locator(".decision[data-tool-use]")).to_have_count(1)
        await expect(page.locator("[id^=no-decide-]")).to_be_visible()
        await expect(page.get_by_role("button", name="Approve")).to_have_count(0)
        await expect(page.locator("#cancel")).to_have_count(0)
        await expect(page.locator("[id^=fork-]")).to_have_count(0)
        # The same page with the admin's token: every control is back.
        await page.evaluate("sessionStorage.setItem('agentrun.token', 'admin-token-1')")
        await page.reload()
        await expect(page.locator("#me")).to_contain_text("default")
        await expect(page.get_by_role("button", name="Approve")).to_be_visible()
        await expect(page.locator("#cancel")).to_be_visible()


async def test_a_call_in_doubt_shows_its_attempt_and_a_handed_back_run_when_it_is_claimable(
    store: RunStore, page: Page
) -> None:
    from agentrun.worker.core.records import DecisionKind
    from tests.support.builders import new_run

    # Held by a worker that is not part of the stack, then parked and handed back as a worker would.
    doubtful, _ = await store.create(new_run())
    backed_off, _ = await store.create(new_run())
    claims = {c.run.id: c for c in await store.claim_many("ghost", 30, limit=2)}
    await store.park(doubtful.id, "ghost", [("toolu_pay", DecisionKind.IN_DOUBT, "pay", "{}", 2)],
                     epoch=claims[doubtful.id].run.lease_epoch)
    async with store.pool.connection() as conn:
        await conn.execute(
            "UPDATE run SET status = 'QUEUED', locked_by = NULL, locked_until = NULL, model_retries = 2, "
            "run_at = now() + interval '1 hour' WHERE id = %s", (backed_off.id,))
    async with stack(store) as (url, _):
        await page.goto(f"{url}/ui/#/runs/{doubtful.id}")
        decision = page.locator(".decision")
        await expect(decision).to_contain_text("in doubt")
        await expect(decision.locator(".attempt")).to_contain_text("interrupted at attempt 2")
        await page.goto(f"{url}/ui/#/runs/{backed_off.id}")
        await expect(page.locator("#handed-back")).to_contain_text("Handed back after 2 failed model steps")
        await expect(page.locator("#handed-back")).to_contain_text("claimable again from")
