"""MCP details against the real test server (tests/mcp/server.py): a server that refuses the worker with
401 or 403 says so, status and challenge, in GET /api/tools and the logs; the client names itself
(`clientInfo`); progress notifications keep a long call going up to its maximum, and reach the run's
events stream as `progress` events.

Timing is by margins a loaded machine keeps: the idle timeout is 2 s and the working tool reports progress
every 0.3 s, so a notification late by 1.7 s would be needed to fail it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from importlib import metadata

import httpx
import pytest

from agentrun.worker.core.records import RunStatus
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolBox, ToolContext
from agentrun.worker.tools.errors import McpConfigError
from agentrun.worker.tools.mcp.config import DEFAULT_MAX_TIMEOUT, parse_servers
from tests.mcp.server import HttpServer
from tests.support.api import make_app
from tests.support.builders import MODEL, new_run, worker
from tests.support.mcp import sessions
from tests.support.serving import serving
from tests.support.sse import streaming
from tests.support.waiting import eventually

TIMED = {"timeoutSeconds": 2, "maxTimeoutSeconds": 5}


def ctx(progress: list[tuple[float, float | None, str | None]] | None = None) -> ToolContext:
    return ToolContext(uuid.uuid4(), f"toolu_{uuid.uuid4().hex[:8]}", 1,
                       progress=(lambda p, t, m: progress.append((p, t, m))) if progress is not None else None)


async def test_a_server_that_answers_401_or_403_shows_the_status_and_challenge(
    store: RunStore, http_server: HttpServer, caplog: pytest.LogCaptureFixture
) -> None:
    base = http_server.url.removesuffix("/mcp")
    caplog.set_level(logging.WARNING, logger="agentrun.worker.tools.mcp.client")
    async with sessions({"name": "locked", "url": f"{base}/deny401"}, {"name": "forbidden", "url": f"{base}/deny403"},
                        {"name": "shop", "url": http_server.url}, wait=False) as mcp:
        locked, forbidden, shop = mcp.servers

        async def refused() -> bool:
            return "HTTP 401" in (locked.error or "") and "HTTP 403" in (forbidden.error or "") and shop.available()

        await eventually(refused, 60, "both refusals to be seen")
        app = make_app(store, ToolBox(sources=mcp.servers), WorkerSettings(database_url="unused", default_model=MODEL),
                       Metrics(cache_seconds=0))
        async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
            servers = {s["name"]: s for s in (await client.get("/api/tools")).json()["servers"]}
    assert servers["locked"]["connected"] is False
    assert servers["locked"]["error"] == 'the server answered HTTP 401 Unauthorized (WWW-Authenticate: Bearer realm="x")'
    assert servers["forbidden"]["connected"] is False
    assert servers["forbidden"]["error"] == "the server answered HTTP 403 Forbidden"
    assert servers["shop"] == {"name": "shop", "transport": "http", "connected": True, "error": None}
    logged = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("MCP server locked: ") and 'HTTP 401 Unauthorized (WWW-Authenticate: Bearer realm="x")'
               in m for m in logged), logged
    assert any(m.startswith("MCP server forbidden: ") and "HTTP 403 Forbidden" in m for m in logged), logged


async def test_the_client_names_itself_agentrun_with_its_version(http_server: HttpServer) -> None:
    async with sessions({"name": "shop", "url": http_server.url}) as mcp:
        result = await mcp.servers[0].call("lookup", {"q": "x"}, ctx())
    assert not result.is_error
    assert http_server.recorder.clients == [{"name": "agentrun", "version": metadata.version("agentrun")}]


async def test_progress_keeps_a_long_call_going_and_reaches_the_caller(http_server: HttpServer) -> None:
    seen: list[tuple[float, float | None, str | None]] = []
    async with sessions({"name": "shop", "url": http_server.url, **TIMED}) as mcp:
        box = ToolBox(sources=mcp.servers)
        assert box.get("shop__slow").timeout_seconds > 5  # type: ignore[union-attr] - the box's bound is the maximum's
        # 3 s of work, longer than the 2 s timeout, with progress each 0.3 s: it completes.
        outcome = await box.execute("shop__slow", {"seconds": 3, "every": 0.3}, ctx(seen))
    assert outcome.ok, outcome.output
    assert outcome.output == "worked 3s"
    assert len(seen) >= 5 and seen[0] == (1.0, 10.0, "step 1")
    assert [p for p, _, _ in seen] == sorted(p for p, _, _ in seen)
    # The token is the SDK's: what matters is that the server got one, so it could report.
    assert http_server.recorder.of("slow")[0]["progressToken"] is not None


async def test_without_progress_a_long_call_times_out(http_server: HttpServer) -> None:
    async with sessions({"name": "shop", "url": http_server.url, **TIMED}) as mcp:
        t0 = time.monotonic()
        outcome = await ToolBox(sources=mcp.servers).execute("shop__slow", {"seconds": 30, "every": 0}, ctx())
    assert not outcome.ok
    assert outcome.output == "error: MCP server shop: slow timed out: no result and no progress for 2s"
    assert time.monotonic() - t0 < 20  # not the 30 s the tool would take


async def test_progress_past_the_maximum_is_stopped(http_server: HttpServer, caplog: pytest.LogCaptureFixture) -> None:
    seen: list[tuple[float, float | None, str | None]] = []
    caplog.set_level(logging.INFO, logger="agentrun.worker.tools.mcp.client")
    async with sessions({"name": "shop", "url": http_server.url, **TIMED}) as mcp:
        t0 = time.monotonic()
        outcome = await ToolBox(sources=mcp.servers).execute("shop__slow", {"seconds": 60, "every": 0.3}, ctx(seen))
        spent = time.monotonic() - t0
    assert not outcome.ok
    assert outcome.output.startswith("error: MCP server shop: slow was stopped after 5s, its most "
                                     "(maxTimeoutSeconds), still sending progress"), outcome.output
    assert 4.5 < spent < 30 and seen
    logged = [r.getMessage() for r in caplog.records]
    assert any("MCP server shop: slow run=" in m and "progress 1/200: step 1" in m for m in logged), logged
    assert any("was stopped after 5s" in m for m in logged), logged


def test_the_maximum_is_configured_beside_the_timeout() -> None:
    [server] = parse_servers({"servers": [{"name": "a", "url": "http://x/mcp", "timeoutSeconds": 10,
                                           "overrides": {"t": {"timeoutSeconds": 20, "maxTimeoutSeconds": 40}}}]}, {})
    assert server.max_timeout_seconds == DEFAULT_MAX_TIMEOUT and server.overrides["t"].max_timeout_seconds == 40
    [long] = parse_servers({"servers": [{"name": "a", "url": "http://x/mcp", "timeoutSeconds": 900}]}, {})
    assert long.max_timeout_seconds == 900  # never below the timeout
    for bad, field in (({"maxTimeoutSeconds": 0}, "servers[0] (a): maxTimeoutSeconds: must be a positive number"),
                       ({"timeoutSeconds": 10, "maxTimeoutSeconds": 5},
                        "servers[0] (a): maxTimeoutSeconds (5) must be at least timeoutSeconds (10)"),
                       ({"overrides": {"t": {"timeoutSeconds": 9, "maxTimeoutSeconds": 3}}},
                        "overrides.t.maxTimeoutSeconds (3) must be at least its timeoutSeconds (9)")):
        with pytest.raises(McpConfigError) as e:
            parse_servers({"servers": [{"name": "a", "url": "http://x/mcp", **bad}]}, {})
        assert field in str(e.value)


async def test_the_events_stream_shows_a_tool_calls_progress(store: RunStore, http_server: HttpServer) -> None:
    async with sessions({"name": "shop", "url": http_server.url, **TIMED}) as mcp:
        box = ToolBox(sources=mcp.servers)
        run, _ = await store.create(new_run(tools=("shop__slow",)))
        llm = (ScriptedLlm().then_tool_uses([("toolu_slow", "shop__slow", {"seconds": 3, "every": 0.3})])
               .then_text("worked"))
        app = make_app(store, box, WorkerSettings(database_url="unused", default_model=MODEL), Metrics(cache_seconds=0))
        async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
            async with streaming(http, f"/api/runs/{run.id}/events") as stream:
                await stream.until(lambda s: bool(s.of("run")), what="the run as it is")
                driving = asyncio.create_task(worker(store, llm, box).run_once())
                await stream.until(lambda s: s.ended, what="the end")
                await driving
    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.SUCCEEDED
    progress = stream.of("progress")
    assert progress, [e.event for e in stream.events]
    assert all(p["toolUseId"] == "toolu_slow" and p["toolName"] == "shop__slow" and p["total"] == 10
               and p["message"] == f"step {p['progress']:g}" for p in progress), progress
    assert [p["progress"] for p in progress] == sorted(p["progress"] for p in progress)
    assert set(progress[0]) == {"toolUseId", "toolName", "progress", "total", "message"}
    # Each came after the tool's step appeared and before its result: in the call's time.
    events = [(e.event, json.loads(e.data)) for e in stream.events]
    kinds = [kind for kind, _ in events]
    first, last = kinds.index("progress"), len(kinds) - 1 - kinds[::-1].index("progress")
    tool_steps = [(i, data["status"]) for i, (kind, data) in enumerate(events)
                  if kind == "step" and data.get("kind") == "TOOL"]
    assert tool_steps and tool_steps[0][0] < first, tool_steps
    done = [i for i, status in tool_steps if status == "DONE"]
    assert done and last < done[0], (tool_steps, first, last)
