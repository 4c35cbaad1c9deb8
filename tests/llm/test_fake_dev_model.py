"""The local model of `agentrun dev` (worker/testing/dev_model.py): schema answers that validate, and the
prompt markers README lists. Through the real anthropic SDK against the local server, as a worker calls it."""

from __future__ import annotations

import time
from typing import Any

import anthropic
import jsonschema
import pytest

from agentrun.worker.core import answer
from agentrun.worker.testing.dev_model import DevResponder, markers, minimal_instance
from agentrun.worker.testing.fake_server import FakeAnthropic

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object"},
    {"type": "object", "properties": {"count": {"type": "integer", "minimum": 3}}, "required": ["count"]},
    {"type": "object", "properties": {"tickets": {"type": "array", "minItems": 2, "uniqueItems": True,
                                                  "items": {"type": "string", "minLength": 4}}},
     "required": ["tickets"], "additionalProperties": False},
    {"type": "object", "properties": {"status": {"enum": ["overdue", "open"]}, "when": {"type": "string",
                                                                                       "format": "date-time"},
                                      "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                                      "ok": {"type": "boolean"}, "nothing": {"type": "null"},
                                      "id": {"const": "T-1"}},
     "required": ["status", "when", "score", "ok", "nothing", "id"]},
    {"type": "object", "$defs": {"item": {"type": "object", "properties": {"n": {"type": "integer",
                                                                                "multipleOf": 5, "minimum": 1}},
                                          "required": ["n"]}},
     "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1}},
     "required": ["items"]},
    {"type": "object", "properties": {"v": {"anyOf": [{"type": "string", "minLength": 2}, {"type": "null"}]},
                                      "w": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
                                                       "required": ["a"]},
                                                      {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
                                      "x": {"type": ["null", "integer"], "maximum": -2}},
     "required": ["v", "w", "x"]},
    {"type": "integer", "minimum": 10},  # wrapped by the engine as {"answer": ...}
    {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
     "minItems": 1},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_the_minimal_instance_is_valid(schema: dict[str, Any]) -> None:
    tool_schema = answer.definition(schema)["input_schema"]
    value = minimal_instance(tool_schema)
    jsonschema.Draft202012Validator(tool_schema).validate(value)
    assert answer.problem(schema, answer.answer_of(schema, value)) is None


def test_markers_are_read() -> None:
    found = markers('please [[tool:lookup {"q": "acme"}]] then [[tool:list_tickets]] [[loop]] [[slow:2]]')
    assert found.tools == (("lookup", {"q": "acme"}), ("list_tickets", None))
    assert found.loop and not found.fail and found.slow == 2.0
    assert markers("[[slow]] [[fail]]").slow == 0.5 and markers("[[fail]]").fail
    assert markers("no markers, [[unknown]]") == markers("")


TOOLS = [{"name": n, "description": n, "input_schema": {"type": "object"}} for n in ("list_tickets", "lookup")]


async def turns(client: anthropic.AsyncAnthropic, text: str, tools: list[dict[str, Any]] = TOOLS,
          limit: int = 6) -> list[anthropic.types.Message]:
    """A conversation the way the engine has it: each tool call answered with a result, until a text answer
    (or `final_answer`) or `limit` turns."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": text}]
    said = []
    for _ in range(limit):
        message = await client.messages.create(model="local", max_tokens=100, messages=messages, tools=tools)  # type: ignore[arg-type]
        said.append(message)
        uses = [b for b in message.content if b.type == "tool_use"]
        if not uses or uses[0].name == "final_answer":
            break
        messages += [{"role": "assistant", "content": [b.model_dump() for b in message.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                   "content": f"result of {uses[0].name}"}]}]
    return said


def called(message: anthropic.types.Message) -> tuple[str, Any] | None:
    uses = [b for b in message.content if b.type == "tool_use"]
    return (uses[0].name, uses[0].input) if uses else None


async def test_the_markers_through_the_sdk() -> None:
    async with FakeAnthropic(DevResponder(chunk_delay=0)) as server:
        client = anthropic.AsyncAnthropic(base_url=server.base_url, api_key="local", max_retries=0)
        plain = await turns(client, "Which acme tickets are overdue?")
        assert [called(m) for m in plain] == [("list_tickets", {"status": "overdue"}), None]
        assert plain[-1].content[0].type == "text" and "result of list_tickets" in plain[-1].content[0].text

        two = await turns(client, '[[tool:lookup {"q": "acme"}]] [[tool:list_tickets]]')
        assert [called(m) for m in two] == [("lookup", {"q": "acme"}), ("list_tickets", {"status": "overdue"}), None]

        looping = await turns(client, "[[loop]] [[tool:lookup]]", limit=5)
        assert [called(m) for m in looping] == [("lookup", {})] * 5

        missing = await turns(client, "[[tool:refund]]")
        assert [called(m) for m in missing] == [None] and "No refund tool" in missing[0].content[0].text

        schema = {"type": "object", "properties": {"count": {"type": "integer", "minimum": 1}}, "required": ["count"]}
        structured = await turns(client, "How many?", tools=[*TOOLS, answer.definition(schema)])
        assert [called(m) for m in structured] == [("list_tickets", {"status": "overdue"}),
                                                   ("final_answer", {"count": 1})]

        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.messages.create(model="local", max_tokens=10, messages=[{"role": "user", "content": "[[fail]]"}])
        assert "[[fail]]" in str(refused.value)

        # A continuation's new input steers it, not the first one's markers.
        later = await client.messages.create(model="local", max_tokens=10, tools=TOOLS, messages=[  # type: ignore[arg-type]
            {"role": "user", "content": "[[fail]]"}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "[[tool:lookup]]"}])
        assert called(later) == ("lookup", {})


async def test_slow_streams_the_answer_slowly() -> None:
    async with FakeAnthropic(DevResponder(chunk_delay=0)) as server:
        client = anthropic.AsyncAnthropic(base_url=server.base_url, api_key="local", max_retries=0)
        messages: list[Any] = [{"role": "user", "content": "[[slow:0.2]] [[tool:nothing]]"}]
        arrivals = []
        async with client.messages.stream(model="local", max_tokens=100, messages=messages) as stream:
            async for _ in stream.text_stream:
                arrivals.append(time.monotonic())
        assert len(arrivals) >= 5
        # Each fragment waits its 0.2 s at least (a loaded machine only makes it longer).
        assert arrivals[-1] - arrivals[0] >= 0.2 * (len(arrivals) - 1) * 0.95
