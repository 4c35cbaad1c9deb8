"""Fixtures for the model client tests: the fake Messages API server and a real SDK client pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agentrun.worker.llm.anthropic_client import AnthropicClient
from agentrun.worker.testing.fake_server import FakeAnthropic
from tests.support.llm import RecordingSleeper


@pytest.fixture
async def fake() -> AsyncIterator[FakeAnthropic]:
    async with FakeAnthropic() as server:
        yield server


@pytest.fixture
async def client(fake: FakeAnthropic) -> AsyncIterator[AnthropicClient]:
    c = AnthropicClient(api_key="test-key", base_url=fake.base_url, http_timeout=10.0)
    try:
        yield c
    finally:
        await c.aclose()


@pytest.fixture
def sleeper() -> RecordingSleeper:
    return RecordingSleeper()
