"""agentrun's durable runtime: store, engine, model clients, tools and the HTTP API.

Tool authors need only this: `from agentrun.worker import tool, ToolContext`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrun.worker.tools import Tool, ToolContext, tool

__all__ = ["Tool", "ToolContext", "tool"]


def __getattr__(name: str) -> Any:
    """The tool authors' names, imported on first use: every `agentrun` command imports this package, and
    the tools (jsonschema with them) would cost `agentrun --help` a third of a second."""
    if name in __all__:
        from agentrun.worker import tools

        return getattr(tools, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
