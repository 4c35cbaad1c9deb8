"""A webhook receiver for the tests: a real HTTP server on 127.0.0.1 that records what it is sent, and an
independent Standard Webhooks verifier written from the specification (hmac, base64), not the package
the worker signs with."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import hmac
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

SECRET = "whsec_" + base64.b64encode(b"agentrun-test-webhook-secret-0123456789").decode()
SECRETS_FILE = json.dumps({"secrets": [{"name": "hooks", "secret": SECRET}]})


def verify(secret: str, headers: dict[str, str], body: bytes, tolerance: float = 300) -> bool:
    """Standard Webhooks: signed content `{id}.{timestamp}.{body}`, HMAC-SHA256 under the base64 key after
    `whsec_`, base64 signature under version `v1`; several space-separated signatures may be given."""
    msg_id, stamp, signatures = headers["webhook-id"], headers["webhook-timestamp"], headers["webhook-signature"]
    if abs(time.time() - int(stamp)) > tolerance:
        return False
    key = base64.b64decode(secret.removeprefix("whsec_"))
    expected = base64.b64encode(hmac.new(key, f"{msg_id}.{stamp}.".encode() + body, hashlib.sha256).digest())
    for item in signatures.split(" "):
        version, _, sig = item.partition(",")
        if version == "v1" and hmac.compare_digest(sig.encode(), expected):
            return True
    return False


@dataclasses.dataclass
class Received:
    headers: dict[str, str]
    body: bytes

    @property
    def id(self) -> str:
        return self.headers["webhook-id"]

    @property
    def json(self) -> Any:
        return json.loads(self.body)


Answer = Callable[[Received], Awaitable[web.StreamResponse]]


async def ok(_: Received) -> web.StreamResponse:
    return web.Response(status=204)


class Receiver:
    """Listens on `port` (given, so it can be started late: 'down' until then)."""

    def __init__(self, port: int, answer: Answer = ok) -> None:
        self.port, self.answer = port, answer
        self.received: list[Received] = []
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        got = Received({k.lower(): v for k, v in request.headers.items()}, await request.read())
        self.received.append(got)
        return await self.answer(got)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # A held request (hold_forever, a killed sender's) is not waited for at the end: 60 s by default.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Receiver:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def hold_forever(_: Received) -> web.StreamResponse:
    await asyncio.sleep(3600)
    return web.Response(status=204)
