"""uvicorn serving the worker's HTTP app inside the worker's own event loop."""

from __future__ import annotations

import contextlib
import gc
import socket
from collections.abc import Iterator

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEAD_BYTES = 16 * 1024
"""The most a request line and its headers may take while incomplete: what h11, uvicorn's parser before
httptools, allowed (its DEFAULT_MAX_INCOMPLETE_EVENT_SIZE). httptools buffers a head without bound."""


class AppSlot:
    """An ASGI app that forwards every request to the app it holds now, so the HTTP server can answer
    from the first moment of the process and the worker swaps its full app in once the database is usable."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


class BoundedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol (its C parser costs less CPU a request than h11's pure Python: bench/README.md
    B15), with h11's bound on a request's head kept: a head still incomplete past MAX_HEAD_BYTES is a 400, the
    connection closed, as h11 refused it. (A head that arrives whole in one read passes, under either.)"""

    _in_head = False
    _head_bytes = 0

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes = True, 0

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._in_head and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self.logger.warning("Invalid HTTP request received: its head is over %d bytes.", MAX_HEAD_BYTES)
                self.send_400_response("Invalid HTTP request received.")


def settle_heap() -> None:
    """Once the worker has built its app, store and runner: what start-up made lives as long as the process, so
    it is moved out of the garbage collector's sight (after one collection, so no garbage is kept). A full
    collection then walks only what came after: on the API, a pause of 40-80 ms every few thousand requests,
    the p99 of B15 (bench/README.md), became one of 4-9 ms."""
    gc.collect()
    gc.freeze()


class HttpServer(uvicorn.Server):
    """uvicorn without its own signal handlers: SIGTERM goes to the worker, which drains its runs while
    health and the API keep answering, and only then stops the HTTP server."""

    def __init__(self, app: ASGIApp, host: str, port: int) -> None:
        super().__init__(
            uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False, lifespan="off",
                           http=BoundedHttpTools)
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
