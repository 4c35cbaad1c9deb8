"""The local model servers' context window: requests that do not fit are refused as the real APIs word it."""

from __future__ import annotations

import anthropic
import openai
import pytest

from agentrun.worker.testing.fake_openai_server import FakeOpenAi
from agentrun.worker.testing.fake_server import FakeAnthropic, count_tokens

MESSAGES = [{"role": "user", "content": "x" * 400}]
SIZE = count_tokens({"messages": MESSAGES})


async def test_a_prompt_over_the_window_is_refused_with_the_real_message() -> None:
    async with FakeAnthropic(context_window=SIZE - 1) as server:
        client = anthropic.AsyncAnthropic(api_key="k", base_url=server.base_url, max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as e:
            await client.messages.create(model="m", max_tokens=10, messages=MESSAGES)  # type: ignore[arg-type]
        assert f"prompt is too long: {SIZE} tokens > {SIZE - 1} maximum" in str(e.value)
        assert server.input_tokens == [SIZE]


async def test_input_and_max_tokens_over_the_window_are_refused() -> None:
    async with FakeAnthropic(context_window=SIZE + 5) as server:
        client = anthropic.AsyncAnthropic(api_key="k", base_url=server.base_url, max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as e:
            await client.messages.create(model="m", max_tokens=10, messages=MESSAGES)  # type: ignore[arg-type]
        assert (f"input length and `max_tokens` exceed context limit: {SIZE} + 10 > {SIZE + 5}, "
                "decrease input length or `max_tokens` and try again") in str(e.value)
        reply = await client.messages.create(model="m", max_tokens=5, messages=MESSAGES)  # type: ignore[arg-type]
        assert reply.content
        assert server.input_tokens == [SIZE, SIZE]


async def test_no_window_keeps_the_old_behaviour() -> None:
    async with FakeAnthropic() as server:
        client = anthropic.AsyncAnthropic(api_key="k", base_url=server.base_url, max_retries=0)
        await client.messages.create(model="m", max_tokens=20_000, messages=MESSAGES)  # type: ignore[arg-type]


async def test_the_chat_server_refuses_with_context_length_exceeded() -> None:
    async with FakeOpenAi(context_window=SIZE + 5) as server:
        client = openai.AsyncOpenAI(api_key="k", base_url=server.v1_url, max_retries=0)
        with pytest.raises(openai.BadRequestError) as e:
            await client.chat.completions.create(model="m", max_tokens=10, messages=MESSAGES)  # type: ignore[arg-type]
        assert e.value.code == "context_length_exceeded"
        assert (f"This model's maximum context length is {SIZE + 5} tokens. However, you requested {SIZE + 10} "
                f"tokens ({SIZE} in the messages, 10 in the completion).") in str(e.value)
        await client.chat.completions.create(model="m", max_completion_tokens=5, messages=MESSAGES)  # type: ignore[arg-type]


LONG = [{"role": "user", "content": "y" * 8000}]
COMPACT = {"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 1000}}]}


async def test_the_compaction_beta_as_the_sdk_speaks_it() -> None:
    from agentrun.worker.testing.fake_server import LongResponder

    async with FakeAnthropic(LongResponder("fetch_page", 5), compaction_min_trigger=1000) as server:
        client = anthropic.AsyncAnthropic(api_key="k", base_url=server.base_url, max_retries=0)
        tools = [{"name": "fetch_page", "input_schema": {"type": "object"}}]
        with pytest.raises(anthropic.BadRequestError, match="Extra inputs are not permitted"):  # no beta header
            await client.post("/v1/messages", cast_to=object, body={  # type: ignore[arg-type]
                "model": "m", "max_tokens": 10, "messages": LONG, "context_management": COMPACT})
        too_low = {"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 10}}]}
        with pytest.raises(anthropic.BadRequestError, match="greater than or equal to 1000"):
            await client.beta.messages.create(model="m", max_tokens=10, messages=LONG,  # type: ignore[arg-type]
                                              betas=["compact-2026-01-12"], context_management=too_low)
        reply = await client.beta.messages.create(model="m", max_tokens=10, messages=LONG, tools=tools,  # type: ignore[arg-type]
                                                  betas=["compact-2026-01-12"], context_management=COMPACT)
        assert reply.content[0].type == "compaction" and reply.content[1].type == "tool_use"
        assert reply.usage.iterations is not None
        assert [i.type for i in reply.usage.iterations] == ["compaction", "message"]
        # Sent back, the block is where the API starts reading: the request is counted from it.
        again = [*LONG, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": reply.content[1].id,  # type: ignore[union-attr]
                                               "content": "ok"}]}]
        await client.beta.messages.create(model="m", max_tokens=10, messages=again, tools=tools,  # type: ignore[arg-type]
                                          betas=["compact-2026-01-12"], context_management=COMPACT)
        assert server.input_tokens[-1] < server.input_tokens[-2] // 4


async def test_context_editing_clears_the_oldest_tool_results_and_says_so() -> None:
    uses = [({"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{i}", "name": "f", "input": {}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": "z" * 2000}]})
            for i in range(5)]
    messages = [{"role": "user", "content": "go"}, *[m for pair in uses for m in pair]]
    edit = {"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 1000},
                       "keep": {"type": "tool_uses", "value": 2}}]}
    async with FakeAnthropic() as server:
        client = anthropic.AsyncAnthropic(api_key="k", base_url=server.base_url, max_retries=0)
        reply = await client.beta.messages.create(  # type: ignore[call-overload]
            model="m", max_tokens=10, messages=messages, tools=[{"name": "f", "input_schema": {"type": "object"}}],
            betas=["context-management-2025-06-27"], context_management=edit)
        assert reply.context_management is not None
        [applied] = reply.context_management.applied_edits
        assert applied.cleared_tool_uses == 3 and applied.cleared_input_tokens > 1000
