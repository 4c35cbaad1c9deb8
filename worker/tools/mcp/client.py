"""One MCP server as a source of tools: its session, kept open and re-opened, and its cached tool list.

A task per server (`run`) owns the session, because the SDK's client must be entered and left in one
task. It opens the session at start, fetches the list, re-fetches it on `notifications/tools/list_changed`,
and after a failure opens a new session with backoff; a call that finds no session wakes it at once and
waits for one within the call's timeout. A server that never answers costs its own tools only.

Each call asks for progress (a progress token): a notification of it starts the call's timeout again, up
to the tool's maximum, and goes to the run's watchers (`ToolContext.progress`). An HTTP error status is
kept from the response itself (`_HttpStatus`), since the SDK reports any of them as the same JSON-RPC error.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections.abc import Mapping
from importlib import metadata
from typing import Any, cast

import anyio
import httpx2
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from pydantic import ValidationError

from agentrun.worker.tools import DEFAULT_INPUT_SCHEMA, SourceStatus, Tool, ToolContext, ToolResult
from agentrun.worker.tools.errors import CallFailed, McpConfigError
from agentrun.worker.tools.mcp import results
from agentrun.worker.tools.mcp.config import ServerConfig

log = logging.getLogger(__name__)

IDEMPOTENCY_KEY = "agentrun.dev/idempotency-key"
LEASE_EPOCH = "agentrun.dev/lease-epoch"
RUN_ID = "agentrun.dev/run-id"
_MAX_LISTED = 1000  # tools of one server: a paginator that never ends cannot grow the list for ever
_MAX_SHOWN = 300  # characters of a foreign error message quoted
PING_SECONDS = 30.0
"""How often an idle session is pinged, so a server that went away shows as not available (GET /api/tools)
and is reconnected before the next call needs it."""
MAX_GRACE = 5.0
"""Seconds the ToolBox's own bound on a call waits past the tool's maximum, so that the call's own bound
(which says that the server kept sending progress) ends it first."""
CONNECT_SHARE = 0.9
"""The part of a call's timeout it may spend waiting for a session to open, when it finds none: the rest
is left so that it ends as "not connected" with the server's last error rather than as a bare timeout."""


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Seconds between attempts to open a session after a failure: doubling from `first` to `cap`."""

    first: float = 1.0
    cap: float = 30.0

    def delay(self, failures: int, rng: random.Random) -> float:
        base: float = min(self.cap, self.first * 2.0 ** max(failures - 1, 0))
        return base * (0.5 + rng.random() / 2)


def client_info() -> types.Implementation:
    """Who the worker is to every server (`clientInfo` of initialize): agentrun and its package version."""
    try:
        version = metadata.version("agentrun")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        version = "0.0.0"
    return types.Implementation(name="agentrun", version=version)


class _HttpStatus:
    """The last HTTP error status of a server's responses, with its `WWW-Authenticate` header: the SDK turns
    every status but 404 into "Server returned an error response", which cannot tell a 401 from a 500."""

    def __init__(self) -> None:
        self.last: str | None = None

    async def __call__(self, response: httpx2.Response) -> None:
        if response.status_code < 400:
            return
        shown = f"HTTP {response.status_code} {response.reason_phrase}".strip()
        if challenge := response.headers.get("www-authenticate"):
            shown += f" (WWW-Authenticate: {challenge})"
        self.last = _shorten(shown)

    def explain(self, e: BaseException) -> str:
        """`_describe(e)`, naming the HTTP status when `e` is the SDK's stand-in for one."""
        from mcp import MCPError

        inner = _first(e)
        if isinstance(inner, MCPError) and inner.error.message == "Server returned an error response" and self.last:
            return f"the server answered {self.last}"
        return _describe(e)


class McpServer:
    """A `ToolSource` (worker/tools/box.py): the tools of one MCP server, named `<server>__<tool>`."""

    def __init__(
        self, config: ServerConfig, backoff: Backoff | None = None, reserved: frozenset[str] = frozenset()
    ) -> None:
        self.config = config
        self.source = f"mcp:{config.name}"
        self.backoff = backoff or Backoff()
        self.reserved = reserved  # names taken by Python tools: an MCP tool never shadows one
        self.listed = False  # a list was fetched once: names of this prefix that are not in it do not exist
        self.error: str | None = "not connected yet"
        self._tools: dict[str, Tool] = {}
        self._client: Client | None = None
        self._session_up = asyncio.Event()
        self.attempted = asyncio.Event()  # the first attempt to open a session ended, either way
        self._wake = asyncio.Event()  # a call wants a session now, or the list changed, or stopping
        self._relist = False
        self._broken = False
        self._stopping = False
        self._rng = random.Random()
        self._http = _HttpStatus()

    # -- ToolSource ------------------------------------------------------------------------------

    def tools(self) -> list[Tool]:
        return list(self._tools.values())

    def get(self, name: str) -> Tool | None:
        found = self._tools.get(name)
        if found is not None or self.listed or not name.startswith(self.config.prefix):
            return found
        if not self.config.allows(name[len(self.config.prefix):]) or name in self.reserved:
            return None
        return self._stand_in(name)

    def available(self) -> bool:
        return self._client is not None

    def status(self) -> SourceStatus:
        up = self.available()
        return SourceStatus(self.config.name, "http" if self.config.url else "stdio", up, None if up else self.error)

    # -- the session ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Keep a session open until `stop`: the task that owns it."""
        failures = 0
        while not self._stopping:
            try:
                async with self._connect() as client:
                    await self._refresh(client)
                    self._client, self._broken, self.error = client, False, None
                    self._session_up.set()
                    self.attempted.set()
                    failures = 0
                    log.info("MCP server %s: connected, tools: %s", self.config.name,
                             ", ".join(self._tools) or "none")
                    await self._serve(client)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - any failure of a foreign server: try again later
                failures += 1
                self.error = self._http.explain(e)
                log.warning("MCP server %s: %s", self.config.name, self.error)
            finally:
                self._client = None
                self._session_up.clear()
                self.attempted.set()
            if self._stopping:
                break
            delay = self.backoff.delay(max(failures, 1), self._rng)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()  # a call that needs the session cuts the wait short

    async def _serve(self, client: Client) -> None:
        while not (self._stopping or self._broken):
            self._wake.clear()
            if self._relist:
                self._relist = False
                await self._refresh(client)
                log.info("MCP server %s: tool list changed, tools: %s", self.config.name,
                         ", ".join(self._tools) or "none")
                continue
            try:
                async with asyncio.timeout(PING_SECONDS):
                    await self._wake.wait()
            except TimeoutError:
                await client.send_ping()  # a failure ends the session: a new one is opened

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    def _connect(self) -> Client:
        c = self.config
        target: Any
        if c.url is not None:
            http = create_mcp_http_client(headers=dict(c.headers), timeout=httpx2.Timeout(30.0, read=300.0))
            self._http.last = None
            http.event_hooks["response"].append(self._http)
            target = streamable_http_client(c.url, http_client=http)
        else:
            assert c.command is not None
            target = StdioServerParameters(command=c.command, args=list(c.args), env=_env(c.env) or None)
        # Legacy mode: the initialize handshake every MCP server speaks, with server notifications
        # (list_changed) on the session. No response cache: a refetch must reach the server.
        return Client(target, mode="legacy", message_handler=self._message, cache=None, client_info=client_info(),
                      read_timeout_seconds=max(c.timeout_seconds, 30.0))

    async def _message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self._relist = True
            self._wake.set()
        elif isinstance(message, Exception):
            log.debug("MCP server %s: %s", self.config.name, message)

    async def _refresh(self, client: Client) -> None:
        listed: list[types.Tool] = []
        cursor: str | None = None
        while len(listed) < _MAX_LISTED:
            page = await client.list_tools(cursor=cursor)
            listed.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        self._check_probes(listed)
        tools: dict[str, Tool] = {}
        for t in listed:
            if not self.config.allows(t.name):
                continue
            name = results.exposed_name(self.config.name, t.name)
            if name in tools or name in self.reserved:
                log.warning("MCP server %s: tool %r is left out: its name %s is taken", self.config.name, t.name,
                            name)
                continue
            tools[name] = self._tool(name, t)
        self._tools, self.listed = tools, True

    def _check_probes(self, listed: list[types.Tool]) -> None:
        """Every `reconcile` of the config names a read-only tool the server lists (allowed or not: the
        model need not see it), else the session fails with a config error saying which."""
        by_name = {t.name: t for t in listed}
        for tool, override in self.config.overrides.items():
            probe = override.reconcile
            if probe is None:
                continue
            at = f"the MCP servers config: {self.config.name}: overrides.{tool}.reconcile"
            found = by_name.get(probe)
            if found is None:
                raise McpConfigError(f"{at} names {probe!r}, which the server does not list (it lists "
                                     f"{', '.join(sorted(by_name)[:20]) or 'no tools'})")
            if found.annotations is None or found.annotations.read_only_hint is not True:
                raise McpConfigError(f"{at} names {probe!r}, which is not read-only (readOnlyHint): a probe "
                                     "must not change anything")

    def _tool(self, name: str, t: types.Tool) -> Tool:
        original = t.name
        idle, maximum = results.timeout(original, self.config), results.max_timeout(original, self.config)
        wait = idle * CONNECT_SHARE

        async def call(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
            try:
                return await self.call(original, args, ctx, wait=wait, idle=idle, maximum=maximum)
            except CallFailed as e:
                return ToolResult(({"type": "text", "text": f"error: {e}"},), is_error=True)

        override = self.config.overrides.get(original)
        probe_tool = override.reconcile if override is not None else None

        async def reconcile(args: dict[str, Any], ctx: ToolContext) -> str | None:
            assert probe_tool is not None
            found = await self._call(probe_tool, {"idempotencyKey": ctx.idempotency_key}, ctx, wait, idle, maximum)
            return results.reconciled(found, probe_tool)  # raises when it cannot tell

        return Tool(name, t.description or t.title or "", results.input_schema(t), call,
                    idempotent=results.idempotent(t, self.config),
                    timeout_seconds=maximum + MAX_GRACE,
                    requires_approval=results.requires_approval(t, self.config),
                    reconcile=reconcile if probe_tool is not None else None,
                    read_only=results.read_only(t), destructive=results.destructive(t))

    def _stand_in(self, name: str) -> Tool:
        """A tool of this server's prefix while its list is not known: not idempotent (a call a crash
        interrupted waits for a person), approval as the server's setting says of a tool it knows
        nothing about, and calling it says the server has not answered."""

        async def call(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
            return ToolResult(({"type": "text", "text": f"error: MCP server {self.config.name} has not answered "
                                f"yet ({self.error}): its tools are not known"},), is_error=True)

        stand_in = types.Tool(name=name[len(self.config.prefix):], input_schema={"type": "object"})
        return Tool(name, "", DEFAULT_INPUT_SCHEMA, call, idempotent=False,
                    timeout_seconds=self.config.timeout_seconds,
                    requires_approval=results.requires_approval(stand_in, self.config))

    async def call(self, tool: str, args: dict[str, Any], ctx: ToolContext, wait: float = 5.0,
                   idle: float | None = None, maximum: float | None = None) -> ToolResult:
        """One tools/call with the idempotency key, lease epoch and run id in `_meta` and a progress token;
        without a session, after waiting up to `wait` seconds for one. It fails after `idle` seconds
        without a progress notification, or after `maximum` in all (None: the caller bounds its time)."""
        return results.tool_result(await self._call(tool, args, ctx, wait, idle, maximum))

    async def _call(self, tool: str, args: dict[str, Any], ctx: ToolContext, wait: float,
                    idle: float | None = None, maximum: float | None = None) -> types.CallToolResult:
        client = self._client
        if client is None:
            self._wake.set()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._session_up.wait()
            client = self._client
            if client is None:
                raise CallFailed(f"MCP server {self.config.name} is not connected: {self.error}")
        meta = cast(types.RequestParamsMeta, {IDEMPOTENCY_KEY: ctx.idempotency_key, LEASE_EPOCH: ctx.lease_epoch,
                                              RUN_ID: str(ctx.run_id)})
        loop = asyncio.get_running_loop()
        started = loop.time()
        ends = started + maximum if maximum is not None else None
        silence = asyncio.timeout_at(None if idle is None else _earliest(started + idle, ends))
        notified = 0

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            nonlocal notified
            notified += 1
            if idle is not None:  # news from the server: it is still working, the wait starts again
                silence.reschedule(_earliest(loop.time() + idle, ends))
            log.info("MCP server %s: %s run=%s id=%s progress %g%s%s", self.config.name, tool, ctx.run_id.hex[:8],
                     ctx.tool_use_id, progress, f"/{total:g}" if total is not None else "",
                     f": {_shorten(message)}" if message else "")
            if ctx.progress is not None:
                ctx.progress(progress, total, message)

        try:
            async with silence:
                # The session's own read timeout would end a call that progress keeps going: it is the maximum.
                result = await client.call_tool(tool, args, meta=meta, progress_callback=on_progress,
                                                read_timeout_seconds=maximum + MAX_GRACE if maximum else None)
        except TimeoutError:
            if not silence.expired():
                raise
            when = silence.when()
            if ends is not None and when is not None and when >= ends and notified:
                why = (f"MCP server {self.config.name}: {tool} was stopped after {maximum:g}s, its most "
                       f"(maxTimeoutSeconds), still sending progress ({notified} notifications)")
            else:
                why = (f"MCP server {self.config.name}: {tool} timed out: no result and no progress for "
                       f"{idle:g}s" + (f" (after {notified} progress notifications)" if notified else ""))
            log.warning("%s run=%s id=%s", why, ctx.run_id.hex[:8], ctx.tool_use_id)
            raise CallFailed(why) from None
        except asyncio.CancelledError:
            raise
        except ValidationError as e:
            raise CallFailed(f"MCP server {self.config.name} answered the call of {tool} with something that is "
                             f"not an MCP result: {_invalid(e)}") from None
        except Exception as e:  # noqa: BLE001 - a foreign server's failure is a result the model sees
            if not _connection_lost(e):
                # The server answered, with a JSON-RPC error or a result the SDK refused (one that breaks
                # the tool's outputSchema, say): the session itself is fine.
                raise CallFailed(
                    f"MCP server {self.config.name} answered the call of {tool} with an error: {self._http.explain(e)}"
                ) from None
            why = f"MCP server {self.config.name} failed during the call of {tool}: {self._http.explain(e)}"
            if self._client is client:  # no later call may use the session that broke: they wait for a new one
                self._client = None
                self._session_up.clear()
                self._broken = True
                self.error = why
                self._wake.set()
            raise CallFailed(why) from None
        return result


def _earliest(at: float, ends: float | None) -> float:
    return at if ends is None else min(at, ends)


def _first(e: BaseException) -> BaseException:
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e


def _connection_lost(e: BaseException) -> bool:
    """Whether the failure is of the connection (the session is then opened again), not of one answer."""
    from mcp import MCPError

    if isinstance(e, BaseExceptionGroup):
        return any(_connection_lost(inner) for inner in e.exceptions)
    if isinstance(e, MCPError):
        return e.error.code == types.CONNECTION_CLOSED
    return isinstance(e, httpx2.TransportError | anyio.ClosedResourceError | anyio.BrokenResourceError
                      | anyio.EndOfStream | OSError | EOFError)


def _invalid(e: ValidationError) -> str:
    problems = e.errors()
    shown = "; ".join(f"{'.'.join(map(str, p['loc'])) or 'result'}: {p['msg']}" for p in problems[:3])
    return _shorten(shown + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""))


def _env(env: Mapping[str, str]) -> dict[str, str]:
    if not env:
        return {}
    from mcp.client.stdio import get_default_environment

    return {**get_default_environment(), **env}


def _describe(e: BaseException) -> str:
    if isinstance(e, BaseExceptionGroup) and e.exceptions:
        return _describe(e.exceptions[0])
    from mcp import MCPError

    text = (e.message if isinstance(e, MCPError) else str(e)).strip()
    return _shorten(f"{type(e).__name__}: {text}" if text else type(e).__name__)


def _shorten(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + "…"
