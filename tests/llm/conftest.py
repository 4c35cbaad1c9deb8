"""Fixtures for the model client tests: the fake Messages API server and a real SDK client pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentrun.worker.llm.anthropic_client import AnthropicClient
from agentrun.worker.testing.fake_server import FakeAnthropic

TOOLS: list[dict[str, Any]] = [
    {
        "name": "list_tickets",
        "description": "List support tickets by status.",
        "input_schema": {"type": "object", "properties": {"status": {"type": "string"}}},
    },
    {"name": "close_ticket", "description": "Close a ticket.", "input_schema": {"type": "object", "properties": {}}},
]


class RecordingSleeper:
    """A fake `Sleeper`: records each wait and returns at once."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


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
