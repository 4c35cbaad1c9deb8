"""Fixtures for the MCP tests: a real MCP server over Streamable HTTP (the worker's sessions to it are in
tests/support/mcp.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.mcp.server import HttpServer


@pytest.fixture
def http_server() -> Iterator[HttpServer]:
    with HttpServer() as server:
        yield server
