"""The MCP servers of one worker, started and stopped together."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from agentrun.worker.tools.errors import McpConfigError
from agentrun.worker.tools.mcp.config import ServerConfig, load_servers

if TYPE_CHECKING:
    from agentrun.worker.tools.mcp.client import Backoff, McpServer


class McpServers:
    """A session task per server, from `start` to `close`. Nothing here waits for a server to answer."""

    def __init__(self, configs: Iterable[ServerConfig], python_tools: Iterable[str] = (),
                 backoff: Backoff | None = None) -> None:
        names = frozenset(python_tools)
        configs = list(configs)
        self.servers: list[McpServer] = []
        if configs:  # the MCP SDK is imported only by a worker that has servers
            from agentrun.worker.tools.mcp.client import McpServer

            self.servers = [McpServer(c, backoff, names) for c in configs]
        for server in self.servers:
            if clash := sorted(n for n in names if n.startswith(server.config.prefix)):
                raise McpConfigError(f"Python tool {clash[0]} has the prefix of MCP server {server.config.name} "
                                     f"({server.config.prefix}): rename the tool or the server")
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    def load(cls, path: str | None, environ: Mapping[str, str], python_tools: Iterable[str] = ()) -> McpServers:
        return cls(load_servers(path, environ), python_tools)

    def start(self) -> None:
        # The MCP SDK's HTTP client logs every request at INFO: chatter, as httpx's is (worker/obs/logs.py).
        if self.servers:
            for noisy in ("httpx2", "httpcore2", "mcp"):
                logging.getLogger(noisy).setLevel(logging.WARNING)
        self._tasks = [asyncio.create_task(s.run(), name=f"mcp-{s.config.name}") for s in self.servers]

    async def settled(self, timeout: float) -> None:
        """Wait (at most `timeout` seconds) until each server's first attempt to connect has ended, so a
        worker that claims runs at once knows the tools of the servers that answer: a call a crash cut
        short is judged by its tool's real `idempotent`, not by the stand-in of a tool not listed yet."""
        pending = [asyncio.ensure_future(s.attempted.wait()) for s in self.servers if not s.attempted.is_set()]
        if pending:
            _, late = await asyncio.wait(pending, timeout=timeout)
            for task in late:
                task.cancel()

    async def close(self) -> None:
        for s in self.servers:
            s.stop()
        if self._tasks:  # a moment to end each session politely (a DELETE, the subprocess's exit)
            await asyncio.wait(self._tasks, timeout=5.0)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
