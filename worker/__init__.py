"""agentrun's durable runtime: store, engine, model clients, tools and the HTTP API.

Tool authors need only this: `from agentrun.worker import tool, ToolContext`.
"""

from agentrun.worker.tools import Tool, ToolContext, tool

__all__ = ["Tool", "ToolContext", "tool"]
