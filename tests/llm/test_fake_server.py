"""The fake Messages API itself: its request checks, its agent mode, and running it as a subprocess."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest

from agentrun.worker.core.types import LlmError, LlmRequest
from agentrun.worker.llm.anthropic_client import AnthropicClient
from agentrun.worker.testing.fake_server import AgentResponder, FakeAnthropic, Reply, check_request
from tests.support.llm import TOOLS

USE = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "list_tickets", "input": {}}]}
RESULT = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "T-1"}]}


def body(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}, *messages], **extra}


def test_a_well_formed_conversation_passes() -> None:
    assert check_request(body(USE, RESULT, tools=TOOLS)) is None


def test_a_tool_use_without_its_result_in_the_next_message_is_refused() -> None:
    text = {"role": "user", "content": [{"type": "text", "text": "and?"}]}
    assert "without `tool_result` blocks immediately after: t1" in (check_request(body(USE, text)) or "")


def test_a_result_without_its_tool_use_is_refused() -> None:
    assert "unexpected `tool_use_id`" in (check_request(body({"role": "assistant", "content": "x"}, RESULT)) or "")


def test_more_than_four_cache_breakpoints_are_refused() -> None:
    cc = {"cache_control": {"type": "ephemeral"}}
    system = [{"type": "text", "text": str(i), **cc} for i in range(5)]
    assert "A maximum of 4 blocks with cache_control" in (check_request(body(system=system)) or "")


@pytest.mark.parametrize("bad", [[], "x", {"model": "m", "max_tokens": 1, "messages": []}])
def test_malformed_bodies_are_refused(bad: Any) -> None:
    assert check_request(bad) is not None


async def test_a_refused_request_is_a_400_for_the_client(fake: FakeAnthropic, client: AnthropicClient) -> None:
    broken = [{"role": "user", "content": "hi"}, USE, {"role": "user", "content": "no result"}]

    with pytest.raises(LlmError) as caught:
        await client.send(LlmRequest("m", 10, broken, tools=TOOLS))

    assert caught.value.status == 400 and "tool_use` ids were found without" in caught.value.message


def test_agent_mode_asks_for_its_tool_then_summarises_the_result() -> None:
    agent = AgentResponder("list_tickets", {"status": "open"})

    first = agent(body(tools=TOOLS))
    assert first.body["stop_reason"] == "tool_use"
    assert first.body["content"][0] | {"id": "-"} == {"type": "tool_use", "id": "-", "name": "list_tickets", "input": {"status": "open"}}
    assert first.body["usage"]["cache_read_input_tokens"] == 0 and first.body["usage"]["cache_creation_input_tokens"] > 0

    second = agent(body(USE, RESULT, tools=TOOLS))
    assert second.body["stop_reason"] == "end_turn"
    assert "T-1" in second.body["content"][0]["text"]
    assert second.body["usage"]["cache_read_input_tokens"] > 0


def test_agent_mode_answers_at_once_when_its_tool_is_not_offered() -> None:
    assert AgentResponder("list_tickets")(body()).body["stop_reason"] == "end_turn"


async def test_scripted_replies_come_first_then_the_responder(fake: FakeAnthropic, client: AnthropicClient) -> None:
    fake.script(Reply.text("scripted"))
    request = LlmRequest("m", 10, [{"role": "user", "content": "hi"}], tools=TOOLS)

    first, second = await client.send(request), await client.send(request)

    assert first.content == [{"type": "text", "text": "scripted"}]
    assert second.stop_reason == "tool_use" and fake.pending == 0


async def test_it_runs_as_a_subprocess() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentrun.worker.testing.fake_server", "--port", "0", "--tool", "list_tickets",
        stdout=subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(20):
            assert proc.stdout is not None
            line = (await proc.stdout.readline()).decode()
        base_url = line.rsplit(" ", 1)[-1].strip()
        assert base_url.startswith("http://127.0.0.1:"), line
        client = AnthropicClient(api_key="k", base_url=base_url, http_timeout=10)
        try:
            response = await client.send(LlmRequest("m", 10, [{"role": "user", "content": "hi"}], tools=TOOLS))
        finally:
            await client.aclose()
        assert response.content[0]["name"] == "list_tickets"
    finally:
        proc.terminate()
        assert await proc.wait() == 0
