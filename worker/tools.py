"""Tools the model may call: the `@tool` decorator, the context a call gets, and the executor.

A tool is declared where it lives and found by import: the worker imports the modules named in
AGENTRUN_TOOLS and collects every `Tool` object defined at their top level. No registry is global.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import types
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import jsonschema

from agentrun.worker.text import storable

ToolFunction = Callable[[dict[str, Any], "ToolContext"], "Awaitable[str] | str"]

DEFAULT_INPUT_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


@dataclasses.dataclass(frozen=True)
class ToolContext:
    """What a tool call knows about itself. `idempotency_key` is stable across re-executions."""

    run_id: uuid.UUID
    tool_use_id: str

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

    @property
    def is_async(self) -> bool:
        """Awaited on the event loop (an `async def`, or an object with an `async def __call__`);
        anything else runs in a thread."""
        return inspect.iscoroutinefunction(self.fn) or inspect.iscoroutinefunction(
            getattr(self.fn, "__call__", None)  # noqa: B004 - the method itself is what is inspected
        )

    def definition(self) -> dict[str, Any]:
        """The tool as the Messages API wants it in a request."""
        return {"name": self.name, "description": self.description, "input_schema": dict(self.input_schema)}

    def __call__(self, args: dict[str, Any], ctx: ToolContext) -> Awaitable[str] | str:
        return self.fn(args, ctx)


def tool(
    *,
    name: str,
    description: str = "",
    input_schema: Mapping[str, Any] | None = None,
    idempotent: bool = True,
    timeout_seconds: float = 30.0,
    requires_approval: bool = False,
) -> Callable[[ToolFunction], Tool]:
    """Declare a tool: `@tool(name="lookup", description="…", input_schema={…}, idempotent=True)`.

    `idempotent=False` says the tool cannot honour `ctx.idempotency_key`: if a worker dies while it runs,
    the run waits for a person to decide (retry, record what it did, or fail) instead of executing it a
    second time. `requires_approval=True` makes every call wait for a person's approval before it runs.
    """
    if not name or not isinstance(name, str):
        raise ValueError("a tool needs a non-empty name")
    if timeout_seconds <= 0:
        raise ValueError(f"tool {name}: timeout_seconds must be positive")
    schema = dict(input_schema or DEFAULT_INPUT_SCHEMA)
    jsonschema.Draft202012Validator.check_schema(schema)

    def wrap(fn: ToolFunction) -> Tool:
        return Tool(
            name, description or (fn.__doc__ or "").strip(), schema, fn, idempotent, timeout_seconds, requires_approval
        )

    return wrap


@dataclasses.dataclass(frozen=True)
class ToolOutcome:
    ok: bool  # False: the model sees the output as an is_error tool_result
    output: str


def load_tool_modules(paths: Iterable[str]) -> list[Tool]:
    """Import each dotted module path and collect the tools defined at its top level."""
    found: list[Tool] = []
    for path in (p.strip() for p in paths):
        if not path:
            continue
        module: types.ModuleType = importlib.import_module(path)
        found.extend(v for v in vars(module).values() if isinstance(v, Tool))
    return found


class ToolBox:
    """The tools a worker can run, and the one place a tool call is executed."""

    def __init__(self, tools: Iterable[Tool] = (), max_output_chars: int = 100_000) -> None:
        self._tools: dict[str, Tool] = {}
        # Built once per tool: jsonschema.validate() re-checks the schema on every call, which was a
        # sixth of a worker's CPU time in the throughput benchmark (bench/README.md).
        self._validators: dict[str, Any] = {}
        for t in tools:
            if t.name in self._tools and self._tools[t.name] is not t:
                raise ValueError(f"two tools are named {t.name!r}")
            self._tools[t.name] = t
            self._validators[t.name] = jsonschema.validators.validator_for(t.input_schema)(t.input_schema)
        self.max_output_chars = max_output_chars

    @property
    def names(self) -> list[str]:
        return sorted(self._tools)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def unknown(self, names: Iterable[str]) -> list[str]:
        return [n for n in names if n not in self._tools]

    def definitions(self, allowed: Iterable[str] | None = None) -> list[dict[str, Any]]:
        names = self.names if allowed is None else [n for n in allowed if n in self._tools]
        return [self._tools[n].definition() for n in names]

    async def execute(
        self, name: str, args: Any, ctx: ToolContext, allowed: Iterable[str] | None = None
    ) -> ToolOutcome:
        """Run one call. Every failure the model can learn from becomes an error outcome.

        Tool exceptions, timeouts, unknown or disallowed names and inputs that break the schema are
        returned, not raised. BaseExceptions (cancellation, a simulated crash) pass through untouched.
        """
        outcome = await self._execute(name, args, ctx, allowed)
        return ToolOutcome(outcome.ok, self._cap(outcome.output))

    async def _execute(self, name: str, args: Any, ctx: ToolContext, allowed: Iterable[str] | None) -> ToolOutcome:
        t = self._tools.get(name)
        if t is None or (allowed is not None and name not in allowed):
            return ToolOutcome(False, f"error: unknown tool {name!r}")
        if not isinstance(args, dict):
            return ToolOutcome(False, f"error: tool input must be a JSON object, got {type(args).__name__}")
        invalid = jsonschema.exceptions.best_match(self._validators[name].iter_errors(args))
        if invalid is not None:
            return ToolOutcome(False, f"error: invalid input for {name}: {invalid.message}")
        try:
            async with asyncio.timeout(t.timeout_seconds):
                if t.is_async:
                    result = await t.fn(args, ctx)  # type: ignore[misc]
                else:
                    # A plain function runs off the event loop. A thread cannot be killed: on timeout we
                    # stop waiting for it, and it finishes (or not) on its own.
                    result = await asyncio.to_thread(t.fn, args, ctx)
        except TimeoutError:
            return ToolOutcome(False, f"error: tool {name} timed out after {t.timeout_seconds:g}s")
        except Exception as e:  # a failing tool is information for the model
            return ToolOutcome(False, f"error: {type(e).__name__}: {e}")
        return ToolOutcome(True, result if isinstance(result, str) else str(result))

    def _cap(self, output: str) -> str:
        """At most `max_output_chars`, storable, and saying so when it was changed: the model and a
        person reading the timeline must know they do not see everything the tool said. Error
        messages go through here too: an exception's text is tool output like any other."""
        notes = []
        if len(output) > self.max_output_chars:
            dropped = len(output) - self.max_output_chars
            output = output[: self.max_output_chars]
            notes.append(f"[output truncated: {dropped} more characters not shown]")
        output, replaced = storable(output)
        if replaced:
            notes.append(f"[{replaced} NUL or invalid characters replaced with U+FFFD]")
        return "\n".join([output, *notes])
