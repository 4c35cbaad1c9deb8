"""What a replay needs to know of a tool: `@tool(..., read_only=True)`, MCP's readOnlyHint and destructiveHint,
and `readOnly` in GET /api/tools."""

from __future__ import annotations

from typing import Any

import httpx
from mcp import types

from agentrun.worker.api.app import create_app
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.tools import ToolBox, load_tool_modules
from agentrun.worker.tools.mcp import results
from tests.mcp.conftest import http_server  # noqa: F401  (a fixture)
from tests.mcp.server import HttpServer
from tests.support.mcp import sessions


def test_python_tools_say_read_only_when_declared() -> None:
    box = ToolBox(load_tool_modules(["tests.replays.tools"]))
    listed = {t.name: t.read_only for t in box.listing()}
    assert listed == {"charge": False, "count": True, "lookup": True, "notify": False}


def _mcp(**hints: Any) -> types.Tool:
    return types.Tool(name="t", input_schema={"type": "object"},
                      annotations=types.ToolAnnotations(**hints) if hints else None)


def test_mcp_hints() -> None:
    assert results.read_only(_mcp(readOnlyHint=True)) and not results.read_only(_mcp())
    assert not results.read_only(_mcp(readOnlyHint=False, idempotentHint=True))
    assert results.destructive(_mcp(destructiveHint=True))
    assert results.destructive(_mcp(readOnlyHint=True, destructiveHint=True))
    assert not results.destructive(_mcp()) and not results.destructive(_mcp(destructiveHint=False))


async def test_mcp_tools_carry_their_hints_and_the_api_shows_read_only(
    store: RunStore, http_server: HttpServer,  # noqa: F811
) -> None:
    async with sessions({"name": "shop", "url": http_server.url}) as mcp:
        box = ToolBox(load_tool_modules(["tests.replays.tools"]), sources=mcp.servers)
        status, charge = box.get("shop__status"), box.get("shop__charge")
        assert status is not None and status.read_only and not status.destructive
        assert charge is not None and not charge.read_only
        app = create_app(store, box, WorkerSettings(database_url="unused"), Metrics())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
            listed = {t["name"]: t["readOnly"] for t in (await http.get("/api/tools")).json()["tools"]}
    assert listed["shop__status"] is True and listed["shop__charge"] is False
    assert listed["lookup"] is True and listed["charge"] is False
