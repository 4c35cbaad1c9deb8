"""The local model of `agentrun dev`: the demo agent, plus prompt markers that make it do what a guard or a
feature needs, so each can be tried by hand without an API key (docs/getting-started/local.md).

Markers are read from the newest user text of the conversation (the run's input, a continuation's input,
a message sent to the run), so a continuation is not bound by its parent's markers:

- `[[tool:NAME]]` calls the tool NAME (with input `{}`; `list_tickets` with the demo's), or
  `[[tool:NAME {"k": "v"}]]` with that JSON object; several are called in order, one per turn. Without
  one, the demo's `list_tickets` is called.
- `[[loop]]` calls the tool again at every turn and never answers: the run ends on its step, token or
  time limit.
- `[[fail]]` answers every model call with the API's 400 `invalid_request_error`: the run fails.
- `[[slow]]` streams the answer a word every half second (`[[slow:2]]`: every 2 s).

A run with an output schema gets a `final_answer` call whose input is the smallest value its schema
accepts (`minimal_instance`). Stateless, like the responder it extends: a resumed run gets the same answers.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

from agentrun.worker.testing.fake_server import (
    AgentResponder,
    Json,
    Reply,
    as_text,
    token_count,
    tool_results,
    usage_of,
)

FINAL_ANSWER = "final_answer"
MARKER = re.compile(r"\[\[(tool|loop|fail|slow)(?::\s*([^\]\s]+)(\s+\{.*?\})?)?\s*\]\]", re.DOTALL)
SLOW_SECONDS = 0.5


@dataclasses.dataclass(frozen=True)
class Markers:
    tools: tuple[tuple[str, Json | None], ...] = ()
    """The tools to call, in order, each with its input (None: none was written)."""
    loop: bool = False
    fail: bool = False
    slow: float | None = None


def markers(text: str) -> Markers:
    """The markers of `text` (see the module's docstring); a tool marker whose input is not a JSON object
    gets `{}`."""
    tools: list[tuple[str, Json | None]] = []
    found = Markers()
    for kind, arg, raw in MARKER.findall(text):
        if kind == "tool" and arg:
            try:
                value = json.loads(raw) if raw.strip() else None
            except ValueError:
                value = {}
            tools.append((arg, value if isinstance(value, dict) or value is None else {}))
        elif kind == "loop":
            found = dataclasses.replace(found, loop=True)
        elif kind == "fail":
            found = dataclasses.replace(found, fail=True)
        elif kind == "slow":
            try:
                seconds = float(arg) if arg else SLOW_SECONDS
            except ValueError:
                seconds = SLOW_SECONDS
            found = dataclasses.replace(found, slow=max(seconds, 0.0))
    return dataclasses.replace(found, tools=tuple(tools))


def newest_user_text(messages: list[Json]) -> str:
    """The text of the newest user message that has some (tool results alone are not one)."""
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        text = content if isinstance(content, str) else " ".join(
            str(b.get("text", "")) for b in content or [] if isinstance(b, dict) and b.get("type") == "text")
        if text.strip():
            return text
    return ""


@dataclasses.dataclass(frozen=True)
class DevResponder:
    """The demo agent (`AgentResponder`: a `list_tickets` call, then a summary), steered by markers."""

    base: AgentResponder = dataclasses.field(
        default_factory=lambda: AgentResponder("list_tickets", {"status": "overdue"}))
    chunk_delay: float = 0.05
    """Seconds between streamed text fragments: slow enough for the UI's live view to show them arriving."""

    def __call__(self, body: Json) -> Reply:
        messages: list[Json] = body.get("messages", [])
        found = markers(newest_user_text(messages))
        if found.fail:
            return Reply.bad_request("[[fail]] in the input: the local model refuses this request")
        return self._reply(body, messages, found).streamed_slowly(
            found.slow if found.slow is not None else self.chunk_delay)

    def _reply(self, body: Json, messages: list[Json], found: Markers) -> Reply:
        offered = {str(t.get("name")): t for t in body.get("tools", []) if isinstance(t, dict)}
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        prefix = [body.get("system"), body.get("tools"), messages[:-1]]
        cached = token_count(prefix) if len(messages) > 1 else 0
        write = token_count(messages[-1:]) + (0 if cached else token_count(prefix))
        # The demo's tool named without an input gets the demo's input (list_tickets needs a status).
        plan = tuple((n, self.base.input if n == self.base.tool and i is None else i or {}) for n, i in found.tools) \
            or ((self.base.tool, self.base.input),)
        called = _called(messages)

        def call(name: str, tool_input: Any) -> Reply:
            return Reply.tool_use(name, tool_input, id=f"toolu_{turn:02d}_{name}", usage=usage_of(3, 40, write, cached))

        if found.loop and plan[0][0] in offered:
            return call(*plan[0])
        for name, tool_input in plan:
            if name in offered and name not in called:
                return call(name, tool_input)
        if FINAL_ANSWER in offered:
            return call(FINAL_ANSWER, minimal_instance(offered[FINAL_ANSWER].get("input_schema") or {"type": "object"}))
        results = [r for m in messages if m.get("role") == "user" for r in tool_results(m)]
        missing = [name for name, _ in plan if name not in offered]
        if results:
            text = f"Summary of {called[-1] if called else 'the tools'}: {as_text(results[-1].get('content'))[:300]}"
        else:
            text = f"No {' or '.join(missing)} tool was offered, so here is an answer without it."
        return Reply.text(text, usage_of(3, token_count(text), write, cached))


def _called(messages: list[Json]) -> list[str]:
    """The tools the assistant has called so far, in order."""
    blocks = [b for m in messages if m.get("role") == "assistant" and isinstance(m.get("content"), list)
              for b in m["content"]]
    return [str(b.get("name")) for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]


FORMATS = {
    "date-time": "2026-01-01T00:00:00Z", "date": "2026-01-01", "time": "00:00:00Z", "email": "a@example.com",
    "uri": "https://example.com/", "uri-reference": "https://example.com/", "hostname": "example.com",
    "ipv4": "127.0.0.1", "ipv6": "::1", "uuid": "00000000-0000-4000-8000-000000000000", "duration": "P1D",
}


def minimal_instance(schema: Any, root: Any = None) -> Any:
    """The smallest value `schema` (JSON Schema, draft 2020-12) accepts, for the common keywords: `const`,
    `enum`, local `$ref`, `allOf`/`anyOf`/`oneOf` (the first branch), and by `type` the required properties,
    `minItems` items, `minLength` characters, a known `format`, and a number within its bounds. A pattern is
    not solved: a string schema with one gets its `examples`' first value or "a"."""
    root = schema if root is None else root
    if not isinstance(schema, Mapping):
        return None  # `true` or an empty schema: anything goes
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    if isinstance(ref := schema.get("$ref"), str) and ref.startswith("#"):
        target: Any = root
        for part in ref[1:].strip("/").split("/") if ref != "#" else []:
            target = target.get(part.replace("~1", "/").replace("~0", "~"), {}) if isinstance(target, Mapping) else {}
        return minimal_instance(target, root)
    if schema.get("allOf"):
        merged: dict[str, Any] = {}
        for part in [schema, *schema["allOf"]]:
            for k, v in (part.items() if isinstance(part, Mapping) else ()):
                if k == "allOf":
                    continue
                if k in ("properties",) and isinstance(v, Mapping):
                    merged[k] = {**merged.get(k, {}), **v}
                elif k == "required":
                    merged[k] = [*merged.get(k, []), *v]
                else:
                    merged.setdefault(k, v)
        return minimal_instance(merged, root)
    for choice in ("anyOf", "oneOf"):
        if schema.get(choice):
            return minimal_instance(schema[choice][0], root)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    if kind is None:
        kind = "object" if "properties" in schema or "required" in schema else \
            "array" if "items" in schema else "string" if "minLength" in schema else None
    if kind == "object":
        properties = schema.get("properties") or {}
        names = list(schema.get("required") or [])
        names += [n for n in properties if n not in names][:max(0, int(schema.get("minProperties", 0)) - len(names))]
        return {n: minimal_instance(properties.get(n, {}), root) for n in names}
    if kind == "array":
        count = int(schema.get("minItems", 0))
        prefix = list(schema.get("prefixItems") or [])
        items = [minimal_instance(s, root) for s in prefix[:count]]
        item = schema.get("items", {})
        while len(items) < count:
            value = minimal_instance(item, root)
            if schema.get("uniqueItems") and value in items:
                value = _distinct(item, len(items))
            items.append(value)
        return items
    if kind == "string":
        if schema.get("format") in FORMATS:
            return FORMATS[schema["format"]]
        if "pattern" in schema and schema.get("examples"):
            return schema["examples"][0]
        return "a" * max(int(schema.get("minLength", 0)), 1 if "pattern" in schema else 0)
    if kind in ("integer", "number"):
        return _number(schema, kind == "integer")
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return None


def _number(schema: Mapping[str, Any], integer: bool) -> int | float:
    low, high = schema.get("minimum"), schema.get("maximum")
    if (x := schema.get("exclusiveMinimum")) is not None and not isinstance(x, bool):
        low = x + (1 if integer else (abs(x) * 1e-9 or 1e-9)) if low is None or x >= low else low
    if (x := schema.get("exclusiveMaximum")) is not None and not isinstance(x, bool):
        high = x - (1 if integer else (abs(x) * 1e-9 or 1e-9)) if high is None or x <= high else high
    value: float = 0
    if low is not None and value < low:
        value = low
    if high is not None and value > high:
        value = high
    step = schema.get("multipleOf")
    if step:
        value = -(-value // step) * step if low is not None else (value // step) * step
    if integer:
        return int(-(-value // 1))
    return value


def _distinct(schema: Any, n: int) -> Any:
    """A value for the n-th item of a `uniqueItems` array: numbers and strings told apart by n."""
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    if kind in ("integer", "number"):
        return n
    length = int(schema.get("minLength", 0)) if isinstance(schema, Mapping) else 0
    return str(n).rjust(max(length, 1), "a")
