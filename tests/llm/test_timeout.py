"""TimeLimited bounds one attempt: a slow answer becomes LlmError(-1, "step timeout"); outer cancels pass through."""

from __future__ import annotations

import asyncio

import pytest

from agentrun.worker.core.types import LlmError, LlmRequest
from agentrun.worker.llm.anthropic_client import AnthropicClient
from agentrun.worker.llm.timeout import TimeLimited
from agentrun.worker.testing.fake_server import FakeAnthropic, Reply

REQUEST = LlmRequest("claude-sonnet-4-5", 256, [{"role": "user", "content": "hello"}])


async def test_a_response_slower_than_the_limit_is_a_step_timeout(fake: FakeAnthropic, client: AnthropicClient) -> None:
    fake.script(Reply.text("too late").after(2.0))

    with pytest.raises(LlmError) as caught:
        await TimeLimited(client, 0.2).send(REQUEST)

    assert caught.value.status == -1 and caught.value.retry_after is None
    assert caught.value.message == "step timeout" and caught.value.retryable


async def test_a_fast_response_is_untouched(fake: FakeAnthropic, client: AnthropicClient) -> None:
    fake.script(Reply.text("quick"))

    response = await TimeLimited(client, 5.0).send(REQUEST)

    assert response.content == [{"type": "text", "text": "quick"}]


async def test_an_outer_deadline_is_not_turned_into_a_step_timeout(fake: FakeAnthropic, client: AnthropicClient) -> None:
    fake.script(Reply.text("too late").after(2.0))

    with pytest.raises(TimeoutError):  # the run's deadline, not an LlmError the retry loop would retry
        async with asyncio.timeout(0.2):
            await TimeLimited(client, 5.0).send(REQUEST)


def test_the_limit_must_be_positive(client: AnthropicClient) -> None:
    with pytest.raises(ValueError, match="positive"):
        TimeLimited(client, 0)
