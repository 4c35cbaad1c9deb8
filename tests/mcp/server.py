"""A real MCP server for the tests, built with the official SDK: over Streamable HTTP in a thread, or
over stdio as `python -m tests.mcp.server` (then `calls` reports what it was asked, over MCP itself).

Every tools/call records its tool, arguments and `_meta`, so a test can see the idempotency key arrive,
and the `clientInfo` the client gave at initialize (`clients`). Over HTTP, `/deny401` and `/deny403` answer
every request with that status, as a server in front of which a gateway refuses the worker's token.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import threading
import time
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.types import ToolAnnotations

from tests.support.ports import free_port

# A 1x1 PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.release = threading.Event()  # what `hold` waits for
        self.ledger: dict[str, str | None] = {}  # what `payment_status` says of a key: done (its result), or not
        self.clients: list[dict[str, Any]] = []  # the clientInfo of each call's session

    def record(self, tool: str, args: dict[str, Any], ctx: Context) -> None:
        meta = ctx.request_context.meta
        params = ctx.session.client_params
        with self.lock:
            seen = dict(meta) if meta else {}
            token = seen.pop("progress_token", None)  # every call has one: kept apart from what agentrun adds
            self.calls.append({"tool": tool, "args": args, "meta": seen, "progressToken": token})
            if params is not None:
                self.clients.append(params.client_info.model_dump(exclude_none=True))

    def of(self, tool: str) -> list[dict[str, Any]]:
        with self.lock:
            return [c for c in self.calls if c["tool"] == tool]


def build(recorder: Recorder) -> MCPServer:
    server = MCPServer("agentrun-test")

    @server.tool(description="Look a word up.", annotations=ToolAnnotations(idempotentHint=True))
    def lookup(q: str, ctx: Context) -> str:
        recorder.record("lookup", {"q": q}, ctx)
        return f"found {q}"

    @server.tool(description="Charge a card: not idempotent, destructive by default.")
    def charge(usd: int, ctx: Context) -> str:
        recorder.record("charge", {"usd": usd}, ctx)
        return f"charged {usd}"

    @server.tool(description="Read-only, non-destructive.", annotations=ToolAnnotations(readOnlyHint=True))
    def status(ctx: Context) -> dict[str, Any]:
        recorder.record("status", {}, ctx)
        return {"healthy": True, "queue": 3}

    @server.tool(description="Marked not destructive.", annotations=ToolAnnotations(destructiveHint=False))
    def note(text: str, ctx: Context) -> str:
        recorder.record("note", {"text": text}, ctx)
        return "noted"

    @server.tool(description="Draw a picture.", annotations=ToolAnnotations(readOnlyHint=True),
                 structured_output=False)
    def picture(ctx: Context) -> Any:
        recorder.record("picture", {}, ctx)
        return ["a red dot:", Image(data=PNG, format="png")]

    @server.tool(description="Always fails.", annotations=ToolAnnotations(readOnlyHint=True))
    def fail(ctx: Context) -> str:
        recorder.record("fail", {}, ctx)
        raise ValueError("the ledger is locked")

    @server.tool(description="Never answers.", annotations=ToolAnnotations(readOnlyHint=True))
    async def hang(ctx: Context) -> str:
        recorder.record("hang", {}, ctx)
        await asyncio.Event().wait()
        return "never"

    @server.tool(description="Waits until the test releases it.", annotations=ToolAnnotations(idempotentHint=True))
    async def hold(ctx: Context) -> str:
        recorder.record("hold", {}, ctx)
        while not recorder.release.is_set():
            await asyncio.sleep(0.02)
        return "released"

    @server.tool(description="Waits until the test releases it; not idempotent.")
    async def hold_once(ctx: Context) -> str:
        recorder.record("hold_once", {}, ctx)
        while not recorder.release.is_set():
            await asyncio.sleep(0.02)
        return "released once"

    @server.tool(description="Works for `seconds`, reporting progress every `every` seconds (0: never).",
                 annotations=ToolAnnotations(readOnlyHint=True))
    async def slow(seconds: float, every: float, ctx: Context) -> str:
        recorder.record("slow", {"seconds": seconds, "every": every}, ctx)
        ends, sent = time.monotonic() + seconds, 0
        while (left := ends - time.monotonic()) > 0:
            await asyncio.sleep(min(every, left) if every > 0 else left)
            if every > 0:
                sent += 1
                await ctx.report_progress(sent, round(seconds / every), f"step {sent}")
        return f"worked {seconds:g}s"

    @server.tool(description="The process exits in the middle of the call.")
    def die(ctx: Context) -> str:
        recorder.record("die", {}, ctx)
        os._exit(3)

    @server.tool(description="Adds the tool `fresh` and says the list changed.")
    async def grow(ctx: Context) -> str:
        recorder.record("grow", {}, ctx)

        def fresh() -> str:
            return "fresh!"

        server.add_tool(fresh, name="fresh", annotations=ToolAnnotations(readOnlyHint=True))
        await ctx.session.send_tool_list_changed()
        return "grown"

    @server.tool(description="Whether a call with this idempotency key was done (a reconcile probe).",
                 annotations=ToolAnnotations(readOnlyHint=True))
    def payment_status(idempotencyKey: str, ctx: Context) -> str:  # noqa: N803 - the probe's argument name
        recorder.record("payment_status", {"idempotencyKey": idempotencyKey}, ctx)
        if idempotencyKey not in recorder.ledger:
            raise LookupError(f"no record of {idempotencyKey}")
        found = recorder.ledger[idempotencyKey]
        return json.dumps({"done": False}) if found is None else found

    @server.tool(description="What this server was asked, as JSON.", annotations=ToolAnnotations(readOnlyHint=True))
    def calls() -> str:
        with recorder.lock:
            return json.dumps(recorder.calls)

    return server


class GarbageOnCall:
    """ASGI middleware: answers a tools/call of `garbage` with a JSON-RPC result that is not MCP, and of
    `nonsense` with a body that is not JSON; everything else goes to the MCP app."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        try:
            request = json.loads(body)
        except ValueError:
            request = None
        name = request.get("params", {}).get("name") if isinstance(request, dict) else None
        if isinstance(request, dict) and request.get("method") == "tools/call" and name in ("garbage", "nonsense"):
            payload = (json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": {"content": "not a list",
                                                                                        "isError": "maybe"}}).encode()
                       if name == "garbage" else b"\x00\xffthis is not json")
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": payload})
            return
        sent = False

        async def replay() -> Any:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def deny(status: int, send: Any) -> None:
    """A refusal as a gateway sends it: plain text, and for 401 the challenge saying what it wants."""
    headers = [(b"content-type", b"text/plain")]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="x"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"no"})


class HttpServer:
    """The server over Streamable HTTP on a free port, in a thread, with a recorder of its calls."""

    def __init__(self, headers_seen: list[dict[str, str]] | None = None) -> None:
        self.recorder = Recorder()
        self.mcp = build(self.recorder)

        @self.mcp.tool(description="The server answers with garbage.", annotations=ToolAnnotations(readOnlyHint=True))
        def garbage() -> str:
            return "unreachable"

        @self.mcp.tool(description="The server answers with bytes that are not JSON.",
                       annotations=ToolAnnotations(readOnlyHint=True))
        def nonsense() -> str:
            return "unreachable"

        self.headers_seen = headers_seen if headers_seen is not None else []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        app = self.mcp.streamable_http_app()
        inner = GarbageOnCall(app)

        async def with_headers(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                self.headers_seen.append({k.decode(): v.decode() for k, v in scope["headers"]})
                if scope["path"] in ("/deny401", "/deny403"):
                    await deny(int(scope["path"][-3:]), send)
                    return
            await inner(scope, receive, send)

        self.server = uvicorn.Server(uvicorn.Config(with_headers, host="127.0.0.1", port=self.port,
                                                    log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, name="mcp-test-server", daemon=True)

    def __enter__(self) -> HttpServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the MCP test server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.recorder.release.set()
        self.server.should_exit = True
        self.thread.join(timeout=30)


if __name__ == "__main__":
    build(Recorder()).run("stdio")
