"""Tools from MCP servers: the config (AGENTRUN_MCP_SERVERS), a session per server, and result mapping.

Each server is a `ToolSource` of the worker's ToolBox (worker/tools.py), so its tools follow the same
rules as Python tools: `idempotent` decides what happens after a crash, `requires_approval` whether a
call waits for a person.
"""

from agentrun.worker.mcp.client import McpServer
from agentrun.worker.mcp.config import McpConfigError, ServerConfig, load_servers
from agentrun.worker.mcp.fleet import McpServers

__all__ = ["McpConfigError", "McpServer", "McpServers", "ServerConfig", "load_servers"]
