"""An ASGI app served for a test: over real HTTP by uvicorn on an ephemeral port, or in-process by httpx."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable

import httpx
import uvicorn
from fastapi import FastAPI

from tests.support.waiting import eventually


@contextlib.asynccontextmanager
async def asgi_client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client calling `app` in this process, without a socket."""
    # raise_app_exceptions=False: the client sees what a real one would, a 500 included.
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://agentrun.test") as client:
        yield client


@contextlib.asynccontextmanager
async def serving_on(make: Callable[[int], uvicorn.Server]) -> AsyncIterator[int]:
    """The server `make` builds for a port, on an ephemeral port in this event loop; yields the port once it is
    listening, and stops it on exit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = make(port)
    task = asyncio.create_task(server.serve(sockets=[sock]))

    async def started() -> bool:
        if task.done():
            task.result()
        return server.started

    await eventually(started, what="the server to start")
    try:
        yield port
    finally:
        server.should_exit = True
        await task
        sock.close()


@contextlib.asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[str]:
    """A real uvicorn server on an ephemeral port in this event loop; yields its base URL."""
    # Keep-alive longer than any test: a test's pooled connection, idle while a browser works through a page
    # on a loaded machine, is otherwise closed by the server as the client sends on it (uvicorn's 5 s).
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off", timeout_keep_alive=600)
    async with serving_on(lambda port: uvicorn.Server(config)) as port:
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            # As the worker's own server does (worker/api/server.py): the events hub closes first, which ends
            # the open streams (else uvicorn waits for them) and its LISTEN on a database about to be dropped.
            if (events := getattr(app.state, "events", None)) is not None:
                await events.close()
