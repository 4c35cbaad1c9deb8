"""The tool of the long-run tests (tests/llm/test_context_process.py), loaded by their worker processes
through AGENTRUN_TOOLS: each call returns a page of 2 KB."""

from __future__ import annotations

from typing import Any

from agentrun.worker.tools import ToolContext, tool

PAGE = ("lorem ipsum dolor sit amet, consectetur adipiscing elit " * 40)[:2048]


@tool(name="fetch_page", description="Fetch one page of the document.",
      input_schema={"type": "object", "properties": {"turn": {"type": "integer"}}})
def fetch_page(args: dict[str, Any], ctx: ToolContext) -> str:
    return PAGE
