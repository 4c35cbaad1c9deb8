"""OpenAiClient through the real `openai` SDK against the local Chat Completions server: conversion both ways,
usage, and errors mapped to the shared `LlmError` classes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentrun.worker.core.types import LlmError, LlmRequest, Usage
from agentrun.worker.llm.openai_client import OpenAiClient
from agentrun.worker.testing.fake_openai_server import (
    FakeOpenAi,
    bad_request,
    completion,
    error,
    rate_limited,
    usage_of,
)
from agentrun.worker.testing.fake_server import Reply
from tests.support.llm import TOOLS


@pytest.fixture
async def chat() -> AsyncIterator[FakeOpenAi]:
    async with FakeOpenAi() as server:
        yield server


@pytest.fixture
async def client(chat: FakeOpenAi) -> AsyncIterator[OpenAiClient]:
    c = OpenAiClient(base_url=chat.v1_url, api_key="sk-test", headers={"X-Team": "agents"}, http_timeout=10.0)
    try:
        yield c
    finally:
        await c.aclose()


def ask(*messages: dict[str, Any], system: str | None = None, tools: list[dict[str, Any]] | None = None) -> LlmRequest:
    return LlmRequest("qwen3-8b", 256, list(messages), system=system, tools=TOOLS if tools is None else tools)


TURN = [
    {"role": "user", "content": "Close the open tickets."},
    {"role": "assistant", "content": [
        {"type": "text", "text": "Looking first."},
        {"type": "tool_use", "id": "call_a", "name": "list_tickets", "input": {"status": "open"}},
        {"type": "tool_use", "id": "call_b", "name": "close_ticket", "input": {"id": "T-1"}},
    ]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "call_a", "content": "T-1, T-2"},
        {"type": "tool_result", "tool_use_id": "call_b", "content": [{"type": "text", "text": "no such ticket"}],
         "is_error": True},
        {"type": "text", "text": "Go on.", "cache_control": {"type": "ephemeral"}},
    ]},
]


async def test_the_request_is_chat_completions_with_system_tools_and_tool_messages(
    chat: FakeOpenAi, client: OpenAiClient
) -> None:
    await client.send(ask(*TURN, system="You triage tickets."))

    body = chat.requests[0]
    assert body["model"] == "qwen3-8b" and body["max_tokens"] == 256
    assert body["tools"][0] == {"type": "function", "function": {
        "name": "list_tickets", "description": "List support tickets by status.",
        "parameters": {"type": "object", "properties": {"status": {"type": "string"}}},
    }}
    assert body["messages"] == [
        {"role": "system", "content": "You triage tickets."},
        {"role": "user", "content": "Close the open tickets."},
        {"role": "assistant", "content": "Looking first.", "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "list_tickets", "arguments": '{"status": "open"}'}},
            {"id": "call_b", "type": "function", "function": {"name": "close_ticket", "arguments": '{"id": "T-1"}'}},
        ]},
        {"role": "tool", "tool_call_id": "call_a", "content": "T-1, T-2"},
        {"role": "tool", "tool_call_id": "call_b", "content": "[tool error] no such ticket"},
        {"role": "user", "content": "Go on."},
    ]
    assert "cache_control" not in json.dumps(body)  # no cache marks where the provider has none
    headers = chat.received[0].headers
    assert headers["Authorization"] == "Bearer sk-test" and headers["X-Team"] == "agents"


async def test_an_assistant_turn_of_tool_calls_only_sends_null_content(chat: FakeOpenAi, client: OpenAiClient) -> None:
    await client.send(ask(
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "call_a", "name": "list_tickets", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_a", "content": "none"}]},
    ))
    messages = chat.requests[0]["messages"]
    assert messages[1]["content"] is None and messages[1]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert messages[2] == {"role": "tool", "tool_call_id": "call_a", "content": "none"}
    assert len(messages) == 3  # no empty user message after the tool messages


async def test_max_completion_tokens_when_the_endpoint_wants_it(chat: FakeOpenAi) -> None:
    client = OpenAiClient(base_url=chat.v1_url, max_tokens_param="max_completion_tokens", http_timeout=10.0)
    try:
        await client.send(ask({"role": "user", "content": "hi"}, tools=[]))
    finally:
        await client.aclose()
    body = chat.requests[0]
    assert body["max_completion_tokens"] == 256 and "max_tokens" not in body and "tools" not in body
    assert chat.received[0].headers["Authorization"] == "Bearer unused"


async def test_parallel_tool_calls_come_back_as_tool_use_blocks(chat: FakeOpenAi, client: OpenAiClient) -> None:
    chat.script(completion(None, [("call_1", "list_tickets", {"status": "open"}), ("call_2", "close_ticket", {})],
                           usage=usage_of(1200, 40, cached=1000)))

    response = await client.send(ask({"role": "user", "content": "hi"}))

    assert response.content == [
        {"type": "tool_use", "id": "call_1", "name": "list_tickets", "input": {"status": "open"}},
        {"type": "tool_use", "id": "call_2", "name": "close_ticket", "input": {}},
    ]
    assert response.stop_reason == "tool_use"
    assert response.usage == Usage(input_tokens=200, output_tokens=40, cache_read_input_tokens=1000)


@pytest.mark.parametrize(("finish", "stop"), [
    ("stop", "end_turn"), ("length", "max_tokens"), ("content_filter", "refusal"),
])
async def test_finish_reasons_map_to_stop_reasons(chat: FakeOpenAi, client: OpenAiClient, finish: str, stop: str) -> None:
    chat.script(completion("Partial answer", finish_reason=finish, usage={"prompt_tokens": 7, "completion_tokens": 3}))

    response = await client.send(ask({"role": "user", "content": "hi"}))

    assert response.content == [{"type": "text", "text": "Partial answer"}]
    assert response.stop_reason == stop
    assert response.usage == Usage(input_tokens=7, output_tokens=3)


async def test_tool_calls_with_finish_reason_stop_are_still_tool_use(chat: FakeOpenAi, client: OpenAiClient) -> None:
    chat.script(completion("Let me look.", [("call_1", "list_tickets", {})], finish_reason="stop"))
    response = await client.send(ask({"role": "user", "content": "hi"}))
    assert response.stop_reason == "tool_use" and [b["type"] for b in response.content] == ["text", "tool_use"]


async def test_a_refusal_is_text_with_stop_reason_refusal(chat: FakeOpenAi, client: OpenAiClient) -> None:
    chat.script(completion(None, refusal="I can't help with that."))
    response = await client.send(ask({"role": "user", "content": "hi"}))
    assert response.content == [{"type": "text", "text": "I can't help with that."}]
    assert response.stop_reason == "refusal"


async def test_429_is_retryable_with_its_retry_after(chat: FakeOpenAi, client: OpenAiClient) -> None:
    chat.script(rate_limited(retry_after=7))
    with pytest.raises(LlmError) as caught:
        await client.send(ask({"role": "user", "content": "hi"}))
    assert caught.value.status == 429 and caught.value.retryable and caught.value.retry_after == 7.0
    assert "Rate limit reached" in caught.value.message


@pytest.mark.parametrize(("status", "retryable"), [(400, False), (401, False), (404, False), (500, True), (503, True)])
async def test_status_errors_keep_the_shared_classes(
    chat: FakeOpenAi, client: OpenAiClient, status: int, retryable: bool
) -> None:
    chat.script(error(status, f"the server says {status}"))
    with pytest.raises(LlmError) as caught:
        await client.send(ask({"role": "user", "content": "hi"}))
    assert (caught.value.status, caught.value.retryable) == (status, retryable)
    assert caught.value.message == f"the server says {status}"


async def test_a_refused_request_names_the_problem(chat: FakeOpenAi, client: OpenAiClient) -> None:
    chat.script(bad_request("This model's maximum context length is 8192 tokens."))
    with pytest.raises(LlmError) as caught:
        await client.send(ask({"role": "user", "content": "hi"}))
    assert caught.value.status == 400 and not caught.value.retryable
    assert "maximum context length is 8192 tokens" in str(caught.value)


async def test_a_dropped_connection_is_retryable_minus_one(chat: FakeOpenAi, client: OpenAiClient) -> None:
    chat.script(Reply.disconnect())
    with pytest.raises(LlmError) as caught:
        await client.send(ask({"role": "user", "content": "hi"}))
    assert caught.value.status == -1 and caught.value.retryable


async def test_tool_arguments_that_are_not_json_are_a_retryable_502(chat: FakeOpenAi, client: OpenAiClient) -> None:
    reply = completion(None, [("call_1", "list_tickets", {})])
    reply.body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = '{"status": "op'
    chat.script(reply)
    with pytest.raises(LlmError) as caught:
        await client.send(ask({"role": "user", "content": "hi"}))
    assert caught.value.status == 502 and caught.value.retryable
    assert "list_tickets" in caught.value.message


async def test_the_fake_refuses_a_tool_call_left_unanswered(chat: FakeOpenAi, client: OpenAiClient) -> None:
    with pytest.raises(LlmError) as caught:
        await client.send(ask(
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "call_a", "name": "list_tickets", "input": {}}]},
            {"role": "user", "content": "and?"},
        ))
    assert caught.value.status == 400 and "call_a" in caught.value.message
