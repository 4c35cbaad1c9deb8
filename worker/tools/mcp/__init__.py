"""Tools from MCP servers: the config (AGENTRUN_MCP_SERVERS), a session per server, and result mapping.

Each server is a `ToolSource` of the worker's ToolBox (worker/tools/box.py), so its tools follow the same
rules as Python tools: `idempotent` decides what happens after a crash, `requires_approval` whether a
call waits for a person.
"""

from typing import TYPE_CHECKING

from agentrun.worker.tools.errors import McpConfigError
from agentrun.worker.tools.mcp.config import ServerConfig, load_servers
from agentrun.worker.tools.mcp.fleet import McpServers

if TYPE_CHECKING:
    from agentrun.worker.tools.mcp.client import McpServer

__all__ = ["McpConfigError", "McpServer", "McpServers", "ServerConfig", "load_servers"]


def __getattr__(name: str) -> object:
    # The MCP SDK (about a second to import) only when a session is made: a worker without MCP servers,
    # and one that refuses its config, never imports it.
    if name == "McpServer":
        from agentrun.worker.tools.mcp.client import McpServer

        return McpServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
