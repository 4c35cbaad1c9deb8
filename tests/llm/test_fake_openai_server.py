"""The local Chat Completions server itself: its request checks, its agent mode, and running it alone."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun.worker.core.types import LlmRequest
from agentrun.worker.llm.openai_client import OpenAiClient
from agentrun.worker.testing.fake_openai_server import ChatAgentResponder, check_chat
from tests.support.llm import TOOLS

ROOT = Path(__file__).resolve().parents[2]
CALL = {"id": "call_1", "type": "function", "function": {"name": "list_tickets", "arguments": "{}"}}


@pytest.mark.parametrize(("body", "problem"), [
    ({"messages": [{"role": "user", "content": "hi"}]}, "Missing required parameter: 'model'"),
    ({"model": "m", "messages": []}, "empty array"),
    ({"model": "m", "messages": [{"role": "human", "content": "hi"}]}, "messages[0].role"),
    ({"model": "m", "messages": [{"role": "tool", "tool_call_id": "call_1", "content": "x"}]}, "preceeding message"),
    ({"model": "m", "messages": [{"role": "assistant", "content": None, "tool_calls": [CALL]},
                                 {"role": "user", "content": "and?"}]}, "call_1"),
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi",
                                                               "cache_control": {"type": "ephemeral"}}]}]},
     "cache_control"),
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "system": "no such field"}, "system"),
])
def test_what_openai_refuses_is_refused(body: dict[str, Any], problem: str) -> None:
    assert problem in (check_chat(body) or "")


def test_a_tool_round_is_fine() -> None:
    assert check_chat({"model": "m", "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "none"},
    ]}) is None


def test_agent_mode_asks_for_parallel_calls_then_summarises() -> None:
    agent = ChatAgentResponder(parallel=3)
    tools = [{"type": "function", "function": {"name": "list_tickets", "parameters": {}}}]
    first = agent({"model": "m", "tools": tools, "messages": [{"role": "user", "content": "hi"}]})
    calls = first.body["choices"][0]["message"]["tool_calls"]
    assert [c["id"] for c in calls] == ["call_00_0", "call_00_1", "call_00_2"]
    answered = [{"role": "tool", "tool_call_id": c["id"], "content": f"result {i}"} for i, c in enumerate(calls)]
    second = agent({"model": "m", "tools": tools, "messages": [
        {"role": "user", "content": "hi"}, first.body["choices"][0]["message"], *answered]})
    choice = second.body["choices"][0]
    assert choice["finish_reason"] == "stop" and "result 2" in choice["message"]["content"]
    assert second.body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


async def test_it_runs_alone_for_the_demo(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentrun.worker.testing.fake_openai_server", "--port", "0", "--parallel", "2",
        stdout=subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(20):
            assert proc.stdout is not None
            line = (await proc.stdout.readline()).decode()
        base_url = line.rsplit(" ", 1)[-1].strip()
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1"), line
        client = OpenAiClient(base_url=base_url, http_timeout=10)
        try:
            response = await client.send(LlmRequest("m", 10, [{"role": "user", "content": "hi"}], tools=TOOLS))
        finally:
            await client.aclose()
        assert [b["name"] for b in response.content] == ["list_tickets", "list_tickets"]
    finally:
        proc.terminate()
        assert await proc.wait() == 0


@pytest.mark.parametrize("model", [
    "claude-sonnet-4-6", "bedrock/us.anthropic.claude-sonnet-4-5-20250929-v1:0", "vertex/claude-sonnet-4-5@20250929",
    "vllm/meta-llama/Llama-3.1-8B-Instruct",
    "bedrock/arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3d4e5f6",
])
def test_the_crd_accepts_prefixed_model_names(model: str) -> None:
    crd = yaml.safe_load((ROOT / "crds" / "agentrun.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["model"]
    assert schema["type"] == "string" and "pattern" not in schema
    assert schema["minLength"] <= len(model) <= schema["maxLength"]
