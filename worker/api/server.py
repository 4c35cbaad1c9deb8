"""uvicorn serving the worker's HTTP app inside the worker's own event loop."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send


class AppSlot:
    """An ASGI app that forwards every request to the app it holds now, so the HTTP server can answer
    from the first moment of the process and the worker swaps its full app in once the database is usable."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


class HttpServer(uvicorn.Server):
    """uvicorn without its own signal handlers: SIGTERM goes to the worker, which drains its runs while
    health and the API keep answering, and only then stops the HTTP server."""

    def __init__(self, app: ASGIApp, host: str, port: int) -> None:
        super().__init__(
            uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False, lifespan="off")
        )
        self.asgi = app

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Event streams never end by themselves: close them first, or shutting down waits for them.
        # The app may sit in an AppSlot: look through it for the one with the event hub.
        app: object = self.asgi
        while getattr(app, "state", None) is None and getattr(app, "app", None) is not None:
            app = getattr(app, "app")  # noqa: B009
        events = getattr(getattr(app, "state", None), "events", None)
        if events is not None:
            await events.close()
        await super().shutdown(sockets)
