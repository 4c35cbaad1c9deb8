"""What every request passes before a route sees it: the bearer token, then the body size limit.

Both are plain ASGI middleware so they answer before FastAPI parses anything: an unauthenticated
client learns nothing about validation, and an oversized body is never buffered whole.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentrun.worker.api.errors import error_response
from agentrun.worker.api.schemas import FieldProblem

API_PREFIX = "/api"


class BearerAuth:
    """When a token is configured, /api requests must carry `Authorization: Bearer <token>`.

    Health, readiness, metrics and the OpenAPI document stay open: probes and Prometheus hold no secret.
    """

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token.encode() if token else None

    def _allowed(self, scope: Scope) -> bool:
        path: str = scope.get("path", "")
        if self.token is None or not (path == API_PREFIX or path.startswith(API_PREFIX + "/")):
            return True
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, given = value.partition(b" ")
                # compare_digest: the time taken says nothing about how much of the token was right.
                return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        response = error_response(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)


class BodyLimit:
    """Refuses a body over `limit` bytes with a 400 naming the limit, reading at most `limit` + one chunk.

    400 rather than 413 because the API's contract answers every bad body with 400/422 and a JSON
    message; the message says what 413 would."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = f"request body is too large: the limit is {self.limit} bytes"
        problem = FieldProblem(field="body", problem=f"larger than {self.limit} bytes")
        await error_response(400, message, [problem])(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await self._too_large(scope, receive, send)
                return
        # Chunked or lying about its length: count what actually arrives.
        buffered: list[Message] = []
        size = 0
        while True:
            message = await receive()
            buffered.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.limit:
                await self._too_large(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(buffered, receive), send)


def _replay(messages: list[Message], receive: Receive) -> Callable[[], Awaitable[Message]]:
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed
