"""Fixtures for the API tests: the app over a real database, an HTTP client, and a real uvicorn server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from agentrun.worker.api.app import create_app
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.tools import ToolBox, ToolContext, tool
from tests.helpers import MODEL, eventually


@tool(name="noop", description="Does nothing.")
def noop(args: dict[str, Any], ctx: ToolContext) -> str:
    return "ok"


@tool(name="lookup", description="Looks a thing up.", input_schema={"type": "object", "properties": {"q": {"type": "string"}}})
async def lookup(args: dict[str, Any], ctx: ToolContext) -> str:
    return f"found {args.get('q')}"


@tool(name="broken", description="Always fails.")
def broken(args: dict[str, Any], ctx: ToolContext) -> str:
    raise RuntimeError("broken on purpose")


@pytest.fixture
def toolbox() -> ToolBox:
    return ToolBox([noop, lookup, broken])


@pytest.fixture
def settings() -> WorkerSettings:
    return WorkerSettings(database_url="unused", worker_id="api-test", default_model=MODEL)


@pytest.fixture
def metrics(store: RunStore) -> Metrics:
    return Metrics(count_runs=store.count_by_status, cache_seconds=0)


def make_app(store: RunStore, toolbox: ToolBox, settings: WorkerSettings, metrics: Metrics) -> FastAPI:
    return create_app(store, toolbox, settings, metrics)


@pytest.fixture
def app(store: RunStore, toolbox: ToolBox, settings: WorkerSettings, metrics: Metrics) -> FastAPI:
    return make_app(store, toolbox, settings, metrics)


@contextlib.asynccontextmanager
async def asgi_client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    # raise_app_exceptions=False: the client sees what a real one would, a 500 included.
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://agentrun.test") as client:
        yield client


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(app) as c:
        yield c


@contextlib.asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[str]:
    """A real uvicorn server on an ephemeral port in this event loop; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))

    async def started() -> bool:
        if task.done():
            task.result()
        return server.started

    await eventually(started, what="uvicorn to start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


@pytest.fixture
async def server_url(app: FastAPI) -> AsyncIterator[str]:
    async with serving(app) as url:
        yield url


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """`agentrun` commands set up logging on the root logger; put it back as pytest had it."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
