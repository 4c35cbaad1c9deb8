"""uvicorn serving the worker's HTTP app inside the worker's own event loop."""

from __future__ import annotations

import contextlib
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

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
