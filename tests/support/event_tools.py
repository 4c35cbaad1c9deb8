"""Tools for the events tests' worker processes (AGENTRUN_TOOLS=tests.support.event_tools)."""

from __future__ import annotations

import asyncio
from typing import Any

from agentrun.worker.tools import ToolContext, tool


@tool(name="lookup", description="Looks a thing up, slowly enough to be seen running.",
      input_schema={"type": "object", "properties": {"q": {"type": "string"}}})
async def lookup(args: dict[str, Any], ctx: ToolContext) -> str:
    await asyncio.sleep(0.5)
    return f"found {args.get('q')}"
