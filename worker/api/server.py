"""uvicorn serving the worker's HTTP app inside the worker's own event loop."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI


class HttpServer(uvicorn.Server):
    """uvicorn without its own signal handlers: SIGTERM goes to the worker, which drains its runs while
    health and the API keep answering, and only then stops the HTTP server."""

    def __init__(self, app: FastAPI, host: str, port: int) -> None:
        super().__init__(
            uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False, lifespan="off")
        )
        self.fastapi = app

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Event streams never end by themselves: close them first, or shutting down waits for them.
        events = getattr(self.fastapi.state, "events", None)
        if events is not None:
            await events.close()
        await super().shutdown(sockets)
