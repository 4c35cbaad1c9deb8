"""The MCP tests' servers as the worker is configured for them, and the worker's sessions to them."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agentrun.worker.tools.mcp import McpServers
from agentrun.worker.tools.mcp.client import Backoff
from agentrun.worker.tools.mcp.config import parse_servers
from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
FAST = Backoff(first=0.05, cap=0.5)  # a retry loop a test does not wait long for (it waits on conditions)


def stdio_server(name: str = "local", **extra: Any) -> dict[str, Any]:
    """The config of the test server over stdio: this Python running tests/mcp/server.py."""
    return {"name": name, "command": sys.executable, "args": ["-m", "tests.mcp.server"],
            "env": {"PYTHONPATH": str(REPO)}, **extra}


@contextlib.asynccontextmanager
async def sessions(*servers: dict[str, Any], env: dict[str, str] | None = None,
                   wait: bool = True) -> AsyncIterator[McpServers]:
    """The worker's sessions to these servers, each listed (when `wait`) before the body runs."""
    fleet = McpServers(parse_servers({"servers": list(servers)}, env or {}), backoff=FAST)
    fleet.start()
    try:
        if wait:
            for server in fleet.servers:
                async def listed(s: Any = server) -> bool:
                    return bool(s.listed and s.available())

                await eventually(listed, 60, f"MCP server {server.config.name} to be listed")
        yield fleet
    finally:
        await fleet.close()
