"""The worker's HTTP server (api/server.py): uvicorn on httptools, with the bound on a request's head h11 had."""

from __future__ import annotations

import asyncio

from starlette.types import Receive, Scope, Send

from agentrun.worker.api.server import MAX_HEAD_BYTES, HttpServer
from tests.support.serving import serving_on


async def answer_ok(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def status_line(port: int, pieces: list[bytes]) -> bytes:
    """The answer's status line to a request sent in `pieces`, each once the last was taken ("" if none came)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
        return await reader.readline()
    except ConnectionError:  # refused and closed while the rest was still being sent
        return b""
    finally:
        writer.close()


async def test_a_request_head_over_the_bound_is_a_400_as_it_was_with_h11() -> None:
    start, header = b"GET /healthz HTTP/1.1\r\nHost: x\r\n", b"X-Pad: " + b"a" * 1000 + b"\r\n"
    ok, bad = b"HTTP/1.1 200 OK\r\n", b"HTTP/1.1 400 Bad Request\r\n"
    within = MAX_HEAD_BYTES // len(header) - 1
    async with serving_on(lambda port: HttpServer(answer_ok, "127.0.0.1", port)) as port:
        assert await status_line(port, [start, *[header] * within, b"\r\n"]) == ok
        # Sent in pieces, as a slow client would, a head past the bound is refused before it ends...
        assert await status_line(port, [start, *[header] * (within + 2)]) == bad
        # ...and so is one header that never ends.
        assert await status_line(port, [start, b"X-Pad: ", *[b"a" * 1000] * (within + 2)]) in (bad, b"")
        # A head that comes whole in one read is parsed at once, under h11 as now: the bound is on what waits.
        assert await status_line(port, [start + header * (within + 2) + b"\r\n"]) == ok
