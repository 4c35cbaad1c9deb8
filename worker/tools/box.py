"""Tools the model may call: the `@tool` decorator, the context a call gets, and the executor.

A tool is declared where it lives and found by import: the worker imports the modules named in
AGENTRUN_TOOLS and collects every `Tool` object defined at their top level. No registry is global.
Tools whose list changes at run time (those of MCP servers, worker/tools/mcp/) come from a `ToolSource`.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import importlib
import inspect
import threading
import time
import types
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

import jsonschema

from agentrun.worker.core import waits
from agentrun.worker.core.replay import BLOCKS_MARK, dump_tool_blocks
from agentrun.worker.core.text import REPLACEMENT, storable
from agentrun.worker.tools.errors import NotStarted, ThreadsFull


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """A result richer than a str: Messages API content blocks (`text` and `image`) for the tool_result,
    and whether it is an error the model sees (`is_error`)."""

    blocks: tuple[dict[str, Any], ...]
    is_error: bool = False


ToolFunction = Callable[[dict[str, Any], "ToolContext"], Any]
"""A tool's function: returns (or, async, resolves to) a str, a ToolResult, or a `WaitForEvent` (the run waits
for that event; the call's result is its payload)."""
ProgressFunction = Callable[[float, "float | None", "str | None"], None]
ReconcileFunction = Callable[[dict[str, Any], "ToolContext"], "Awaitable[str | None] | str | None"]
"""A tool's reconcile probe: given a call in doubt (its input, and `ctx.idempotency_key` as the call had
it), the call's result when it was done, None when it was not; it raises when it cannot tell."""

DEFAULT_INPUT_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


@dataclasses.dataclass(frozen=True)
class ToolContext:
    """What a tool call knows about itself. `idempotency_key` is stable across re-executions.

    `lease_epoch` names the claim of the run this execution is made under: it grows with every claim, so
    a service that saw a higher one for the same key can refuse a caller that has since been replaced."""

    run_id: uuid.UUID
    tool_use_id: str
    lease_epoch: int = 0
    progress: ProgressFunction | None = dataclasses.field(default=None, compare=False, repr=False)
    """Told of the call's progress (progress, total or None, message or None) for live watchers: the
    engine passes one that publishes `progress` events (worker/runtime/deltas.py); MCP calls use it."""

    @property
    def idempotency_key(self) -> str:
        return self.tool_use_id


@dataclasses.dataclass(frozen=True)
class Tool:
    name: str
    description: str
    input_schema: Mapping[str, Any]
    fn: ToolFunction
    idempotent: bool = True
    timeout_seconds: float = 30.0
    requires_approval: bool = False
    reconcile: ReconcileFunction | None = None
    """Asked about a call in doubt before a person is (engine.py): done, not done, or cannot tell."""
    read_only: bool = False
    """It only reads: a replay run may call it live when the recording has no result for the call (the
    `recorded_then_live_readonly` tool policy), if it is idempotent and not destructive too."""
    destructive: bool = False
    """Said to change the world irreversibly (an MCP tool's `destructiveHint: true`): never called by a replay."""

    @property
    def is_async(self) -> bool:
        """Awaited on the event loop (an `async def`, or an object with an `async def __call__`);
        anything else runs in a thread."""
        return _is_async(self.fn)

    def definition(self) -> dict[str, Any]:
        """The tool as the Messages API wants it in a request."""
        return {"name": self.name, "description": self.description, "input_schema": dict(self.input_schema)}

    def __call__(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return self.fn(args, ctx)


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - the method itself is what is inspected
    )


@dataclasses.dataclass(frozen=True)
class Probed:
    """What a reconcile probe found about a call in doubt."""

    done: bool | None  # None: it cannot tell (it raised, timed out, or answered something else)
    output: str = ""  # done: the call's result; cannot tell: why


@dataclasses.dataclass(frozen=True)
class ToolInfo:
    """One tool as GET /api/tools lists it."""

    name: str
    source: str  # `python`, or `mcp:<server>`
    idempotent: bool
    requires_approval: bool
    available: bool
    read_only: bool = False


@dataclasses.dataclass(frozen=True)
class SourceStatus:
    """A tool source (an MCP server) as GET /api/tools shows it."""

    name: str
    transport: str  # `http` or `stdio`
    connected: bool
    error: str | None


class ToolSource(Protocol):
    """Tools whose list changes while the worker runs (an MCP server's). Asked on every lookup."""

    source: str
    """What GET /api/tools shows as the tools' source: `mcp:<server>`."""

    def tools(self) -> list[Tool]:
        """The tools known now, for the model's requests."""
        ...

    def get(self, name: str) -> Tool | None:
        """The tool of that name, or None if it is not this source's. May be a stand-in for a tool of a
        source not reached yet, which is not idempotent and answers with an error saying why."""
        ...

    def available(self) -> bool:
        """Whether calls can go through now."""
        ...

    def status(self) -> SourceStatus: ...


def tool(
    *,
    name: str,
    description: str = "",
    input_schema: Mapping[str, Any] | None = None,
    idempotent: bool = True,
    timeout_seconds: float = 30.0,
    requires_approval: bool = False,
    reconcile: ReconcileFunction | None = None,
    read_only: bool = False,
) -> Callable[[ToolFunction], Tool]:
    """Declare a tool: `@tool(name="lookup", description="…", input_schema={…}, idempotent=True)`.

    `idempotent=False` says the tool cannot honour `ctx.idempotency_key`: if a worker dies while it runs,
    the run waits for a person to decide (retry, record what it did, or fail) instead of executing it a
    second time. `requires_approval=True` makes every call wait for a person's approval before it runs.
    `reconcile=fn` lets such a tool settle a call in doubt itself: `fn(args, ctx)` (sync or async, within
    `timeout_seconds`) returns the call's result when the call was done, None when it was not (it then
    runs again), and raises when it cannot tell (a person is asked, as without a probe).
    `read_only=True` says a call changes nothing: a replay under the `recorded_then_live_readonly` tool policy
    may call it live when the recording has no result for the call (never a tool that is not idempotent).
    """
    if reconcile is not None and not callable(reconcile):
        raise ValueError(f"tool {name}: reconcile must be a function (args, ctx) -> str | None")
    if not name or not isinstance(name, str):
        raise ValueError("a tool needs a non-empty name")
    if timeout_seconds <= 0:
        raise ValueError(f"tool {name}: timeout_seconds must be positive")
    schema = dict(input_schema or DEFAULT_INPUT_SCHEMA)
    jsonschema.Draft202012Validator.check_schema(schema)

    def wrap(fn: ToolFunction) -> Tool:
        return Tool(
            name, description or (fn.__doc__ or "").strip(), schema, fn, idempotent, timeout_seconds, requires_approval,
            reconcile, read_only,
        )

    return wrap


@dataclasses.dataclass(frozen=True)
class ToolOutcome:
    ok: bool  # False: the model sees the output as an is_error tool_result
    output: str  # the text, or content blocks as `replay.dump_tool_blocks` writes them
    wait: waits.WaitRequest | None = None  # the call asks the run to wait: its result comes when the wait ends


def _wait_tool(args: dict[str, Any], ctx: ToolContext) -> waits.WaitRequest:
    return waits.timer_of(args)


def _wait_for_event_tool(args: dict[str, Any], ctx: ToolContext) -> waits.WaitRequest:
    return waits.event_of(args)


BUILTINS: dict[str, Tool] = {
    waits.WAIT: Tool(waits.WAIT, waits.WAIT_DESCRIPTION, waits.WAIT_SCHEMA, _wait_tool),
    waits.WAIT_FOR_EVENT: Tool(waits.WAIT_FOR_EVENT, waits.WAIT_FOR_EVENT_DESCRIPTION, waits.WAIT_FOR_EVENT_SCHEMA,
                               _wait_for_event_tool),
}
"""The built-in tools (core/waits.py): offered only to a run (or agent) whose `tools` lists them; a Python
or MCP tool of the same name wins."""


def load_tool_modules(paths: Iterable[str]) -> list[Tool]:
    """Import each dotted module path and collect the tools defined at its top level."""
    found: list[Tool] = []
    for path in (p.strip() for p in paths):
        if not path:
            continue
        module: types.ModuleType = importlib.import_module(path)
        found.extend(v for v in vars(module).values() if isinstance(v, Tool))
    return found


class ToolThreads:
    """The threads plain (synchronous) tools run in: at most `size` at once, each call in a thread of its own.

    A thread cannot be killed, so a tool that overruns its timeout keeps its thread until it returns.
    Such threads are counted (`overdue`, exported as a gauge) and keep their slot: when all `size` are
    busy a new call is refused at once with an error saying so, instead of queueing silently in the
    event loop's shared default executor (which the database driver's DNS lookups need too). A call
    whose timeout ran out before its thread began is never started. The threads are daemons, so a
    tool hung for good does not keep the process from exiting.
    """

    def __init__(self, size: int = 32, clock: Callable[[], float] = time.monotonic) -> None:
        if size < 1:
            raise ValueError("tool threads: size must be at least 1")
        self.size = size
        self._clock = clock
        self._lock = threading.Lock()
        self._busy = 0  # calls holding a slot: not yet returned, or not yet given up before they started
        self.running = 0
        """Threads running a tool now."""
        self.overdue = 0
        """Of those, the ones whose caller stopped waiting (timed out or cancelled): still running."""

    async def call(self, name: str, fn: Callable[..., Any], *args: Any, timeout: float) -> Any:
        """`fn(*args)` in a tool thread. TimeoutError after `timeout` seconds (the thread may run on),
        ThreadsFull if every slot is busy, NotStarted if the time ran out before the thread began."""
        with self._lock:
            if self._busy >= self.size:
                raise ThreadsFull(
                    f"all {self.size} tool threads are busy ({self.overdue} still running after their timeout)"
                )
            self._busy += 1
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        deadline = self._clock() + timeout
        state = {"started": False, "finished": False, "abandoned": False}
        context = contextvars.copy_context()

        def settle(result: Any, error: BaseException | None) -> None:
            if done.done():
                return
            if error is not None:
                done.set_exception(error)
            else:
                done.set_result(result)

        def work() -> None:
            with self._lock:
                if state["abandoned"]:
                    return  # the caller gave up first and freed the slot
                if self._clock() >= deadline:
                    state["abandoned"] = True
                    self._busy -= 1
                    start_error: BaseException | None = NotStarted()
                else:
                    start_error = None
                    state["started"] = True
                    self.running += 1
            if start_error is not None:
                _call_back(loop, settle, None, start_error)
                return
            result, error = None, None
            try:
                result = context.run(fn, *args)
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine, which re-raises it
                error = e
            finally:
                with self._lock:
                    state["finished"] = True
                    self.running -= 1
                    self._busy -= 1
                    if state["abandoned"]:
                        self.overdue -= 1
            _call_back(loop, settle, result, error)

        try:
            threading.Thread(target=work, name=f"agentrun-tool-{name}", daemon=True).start()
        except RuntimeError as e:  # the system cannot start another thread
            with self._lock:
                state["abandoned"] = True
                self._busy -= 1
            raise ThreadsFull(f"cannot start a tool thread: {e}") from e
        try:
            async with asyncio.timeout(timeout):
                return await done
        except BaseException:
            with self._lock:
                if not state["abandoned"]:
                    state["abandoned"] = True
                    if not state["started"]:
                        self._busy -= 1  # never started, and now never will
                    elif not state["finished"]:
                        self.overdue += 1  # it runs on; `work` counts it out when it returns
            raise


def _call_back(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass  # the event loop is closed: nobody is waiting any more


class ToolBox:
    """The tools a worker can run, and the one place a tool call is executed.

    Python tools are fixed at start; the `sources` (MCP servers) are asked on each lookup, so their
    tools come and go without a restart. A Python tool's name wins over a source's.
    """

    def __init__(
        self, tools: Iterable[Tool] = (), max_output_chars: int = 100_000, threads: ToolThreads | None = None,
        sources: Iterable[ToolSource] = (),
    ) -> None:
        self._tools: dict[str, Tool] = {}
        # Built once per tool: jsonschema.validate() re-checks the schema on every call, which was a
        # sixth of a worker's CPU time in the throughput benchmark (bench/README.md). A source's tool
        # gets its validator at its first call, built again when the source replaced the tool.
        self._validators: dict[str, tuple[Tool, Any]] = {}
        for t in tools:
            if t.name in self._tools and self._tools[t.name] is not t:
                raise ValueError(f"two tools are named {t.name!r}")
            self._tools[t.name] = t
            self._validators[t.name] = (t, _validator(t.input_schema))
        self.sources = tuple(sources)
        self.max_output_chars = max_output_chars
        self.threads = threads or ToolThreads()

    @property
    def dynamic(self) -> bool:
        """Whether the list of tools can change while the worker runs."""
        return bool(self.sources)

    @property
    def names(self) -> list[str]:
        return sorted({*self._tools, *(t.name for s in self.sources for t in s.tools())})

    def get(self, name: str) -> Tool | None:
        found = self._tools.get(name)
        if found is not None:
            return found
        for source in self.sources:
            if (found := source.get(name)) is not None:
                return found
        return BUILTINS.get(name)

    def unknown(self, names: Iterable[str]) -> list[str]:
        return [n for n in names if self.get(n) is None]

    def label(self, name: str, unknown: str) -> str:
        """`name` if it is one of these tools, else `unknown`: model output never picks a metric label
        (a stand-in for a tool of a server not reached yet is not one of them)."""
        if name in self._tools or any(t.name == name for s in self.sources for t in s.tools()):
            return name
        return unknown

    def definitions(self, allowed: Iterable[str] | None = None) -> list[dict[str, Any]]:
        known = {**{t.name: t for s in reversed(self.sources) for t in s.tools()}, **self._tools}
        if allowed is None:
            return [known[n].definition() for n in sorted(known)]
        known = {**BUILTINS, **known}  # a built-in only when the run lists it
        return [known[n].definition() for n in allowed if n in known]

    def listing(self) -> list[ToolInfo]:
        """Every tool known now, Python and from sources, by name."""
        found = {t.name: ToolInfo(t.name, "python", t.idempotent, t.requires_approval, True, t.read_only)
                 for t in self._tools.values()}
        for source in self.sources:
            up = source.available()
            for t in source.tools():
                found.setdefault(t.name, ToolInfo(t.name, source.source, t.idempotent, t.requires_approval, up,
                                                  t.read_only))
        return [found[n] for n in sorted(found)]

    def servers(self) -> list[SourceStatus]:
        return [s.status() for s in self.sources]

    async def execute(
        self, name: str, args: Any, ctx: ToolContext, allowed: Iterable[str] | None = None
    ) -> ToolOutcome:
        """Run one call. Every failure the model can learn from becomes an error outcome.

        Tool exceptions, timeouts, unknown or disallowed names and inputs that break the schema are
        returned, not raised. BaseExceptions (cancellation, a simulated crash) pass through untouched.
        """
        ok, output = await self._execute(name, args, ctx, allowed)
        if isinstance(output, waits.WaitForEvent | waits.WaitForTimer):
            return ToolOutcome(True, "", wait=output)
        if isinstance(output, ToolResult):
            return ToolOutcome(ok and not output.is_error, self._cap_blocks(output.blocks))
        return ToolOutcome(ok, self._text(output))

    def _text(self, output: str) -> str:
        if output.startswith(BLOCKS_MARK):  # a plain text never reads back as blocks (replay.BLOCKS_MARK)
            output = REPLACEMENT + output[len(BLOCKS_MARK):]
        return self._cap(output)

    def reconcile_probe(self, name: str) -> Callable[[Any, ToolContext], Awaitable[Probed]] | None:
        """The reconcile probe of the tool `name`, or None if it has none (or there is no such tool)."""
        t = self.get(name)
        if t is None or t.reconcile is None:
            return None
        probe = t.reconcile

        async def ask(args: Any, ctx: ToolContext) -> Probed:
            return await self._probe(t, probe, args, ctx)

        return ask

    async def _probe(self, t: Tool, probe: ReconcileFunction, args: Any, ctx: ToolContext) -> Probed:
        """Ask `probe` about a call of `t` in doubt, within the tool's timeout. Anything but a string or
        None, an exception or the time running out is "cannot tell", saying why."""
        try:
            if _is_async(probe):
                async with asyncio.timeout(t.timeout_seconds):
                    found = await probe(args, ctx)  # type: ignore[misc]
            else:
                found = await self.threads.call(f"{t.name}-reconcile", probe, args, ctx, timeout=t.timeout_seconds)
        except TimeoutError:
            return Probed(None, f"the reconcile probe of {t.name} timed out after {t.timeout_seconds:g}s")
        except (NotStarted, ThreadsFull) as e:
            return Probed(None, f"the reconcile probe of {t.name} was not started: {e or 'its time ran out first'}")
        except Exception as e:  # noqa: BLE001 - a probe that fails cannot tell; a person is asked
            return Probed(None, self._cap(f"the reconcile probe of {t.name} failed: {type(e).__name__}: {e}"))
        if found is None:
            return Probed(False)
        if not isinstance(found, str):
            return Probed(None, f"the reconcile probe of {t.name} returned a {type(found).__name__}, "
                          "not the call's result (a string) or None")
        return Probed(True, self._text(found))

    async def _execute(
        self, name: str, args: Any, ctx: ToolContext, allowed: Iterable[str] | None
    ) -> tuple[bool, str | ToolResult | waits.WaitRequest]:
        t = self.get(name)
        builtin = t is not None and BUILTINS.get(name) is t
        if t is None or (allowed is not None and name not in allowed) or (builtin and allowed is None):
            return False, f"error: unknown tool {name!r}"
        if not isinstance(args, dict):
            return False, f"error: tool input must be a JSON object, got {type(args).__name__}"
        invalid = jsonschema.exceptions.best_match(self._validator_of(t).iter_errors(args))
        if invalid is not None:
            return False, f"error: invalid input for {name}: {invalid.message}"
        try:
            if t.is_async:
                async with asyncio.timeout(t.timeout_seconds):
                    result = await t.fn(args, ctx)
            else:
                # A plain function runs off the event loop, in a bounded pool of its own (ToolThreads).
                result = await self.threads.call(name, t.fn, args, ctx, timeout=t.timeout_seconds)
        except TimeoutError:
            return False, f"error: tool {name} timed out after {t.timeout_seconds:g}s"
        except NotStarted:
            return False, f"error: tool {name} was not started: its {t.timeout_seconds:g}s ran out first"
        except ThreadsFull as e:
            return False, f"error: tool {name} was not started: {e}"
        except Exception as e:  # a failing tool is information for the model
            return False, f"error: {type(e).__name__}: {e}"
        if isinstance(result, ToolResult | waits.WaitForEvent | waits.WaitForTimer):
            return True, result
        return True, result if isinstance(result, str) else str(result)

    def _validator_of(self, t: Tool) -> Any:
        cached = self._validators.get(t.name)
        if cached is not None and cached[0] is t:
            return cached[1]
        validator = _validator(t.input_schema)
        self._validators[t.name] = (t, validator)
        return validator

    def _cap(self, output: str) -> str:
        """At most `max_output_chars`, storable, and saying so when it was changed: the model and a
        person reading the timeline must know they do not see everything the tool said. Error
        messages go through here too: an exception's text is tool output like any other."""
        return self._capped(output, self.max_output_chars)

    @staticmethod
    def _capped(output: str, limit: int) -> str:
        notes = []
        if len(output) > limit:
            dropped = len(output) - limit
            output = output[:limit]
            notes.append(f"[output truncated: {dropped} more characters not shown]")
        output, replaced = storable(output)
        if replaced:
            notes.append(f"[{replaced} NUL or invalid characters replaced with U+FFFD]")
        return "\n".join([output, *notes])

    def _cap_blocks(self, blocks: Iterable[dict[str, Any]]) -> str:
        """Content blocks under the same cap, counted in characters of text and of base64 image data:
        text past it is truncated, an image past it is left out, each with a note saying so. Only text
        blocks: one string, as a Python tool's output; with an image: the blocks (replay.BLOCKS_MARK)."""
        left = self.max_output_chars
        kept: list[dict[str, Any]] = []
        for b in blocks:
            if b.get("type") == "image":
                data = str(b.get("source", {}).get("data", ""))
                if len(data) <= left:
                    kept.append(b)
                    left -= len(data)
                else:
                    kept.append({"type": "text", "text": f"[image not shown: its {len(data)} characters of "
                                 f"base64 data are over the {self.max_output_chars}-character output cap]"})
            else:
                text = str(b.get("text", ""))
                capped = self._capped(text, max(left, 0))
                left -= min(len(text), max(left, 0))
                if capped:
                    kept.append({"type": "text", "text": capped})
        if all(b["type"] == "text" for b in kept):
            return "\n".join(b["text"] for b in kept)
        return dump_tool_blocks(kept)


def _validator(schema: Mapping[str, Any]) -> Any:
    return jsonschema.validators.validator_for(schema)(schema)
