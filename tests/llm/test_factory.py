"""llm_from_env: the worker's model client from the environment, or a clear exit."""

from __future__ import annotations

import pytest

from agentrun.worker.core.types import LlmRequest
from agentrun.worker.llm.factory import LlmSettings, llm_from_env
from agentrun.worker.llm.retry import Retrying
from agentrun.worker.llm.timeout import TimeLimited
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.testing.fake_server import FakeAnthropic

SETTINGS = WorkerSettings(database_url="unused")


def test_defaults_when_nothing_is_set() -> None:
    assert LlmSettings.from_env({}) == LlmSettings()


def test_values_come_from_the_environment() -> None:
    s = LlmSettings.from_env({
        "AGENTRUN_LLM_MAX_ATTEMPTS": "3", "AGENTRUN_LLM_TIMEOUT_SECONDS": "45.5",
        "AGENTRUN_LLM_BACKOFF_BASE_SECONDS": "0.25", "AGENTRUN_LLM_BACKOFF_CAP_SECONDS": "10",
    })
    assert (s.max_attempts, s.timeout_seconds, s.backoff_base_seconds, s.backoff_cap_seconds) == (3, 45.5, 0.25, 10.0)
    assert s.http_client == "aiohttp"
    assert LlmSettings.from_env({"AGENTRUN_LLM_HTTP_CLIENT": " HTTPX "}).http_client == "httpx"


@pytest.mark.parametrize(("var", "value", "message"), [
    ("AGENTRUN_LLM_MAX_ATTEMPTS", "0", "AGENTRUN_LLM_MAX_ATTEMPTS must be at least 1"),
    ("AGENTRUN_LLM_MAX_ATTEMPTS", "2.5", "AGENTRUN_LLM_MAX_ATTEMPTS must be a whole number"),
    ("AGENTRUN_LLM_TIMEOUT_SECONDS", "soon", "AGENTRUN_LLM_TIMEOUT_SECONDS must be a number"),
    ("AGENTRUN_LLM_TIMEOUT_SECONDS", "0", "AGENTRUN_LLM_TIMEOUT_SECONDS must be at least"),
    ("AGENTRUN_LLM_BACKOFF_CAP_SECONDS", "-1", "AGENTRUN_LLM_BACKOFF_CAP_SECONDS must be at least 0"),
    ("AGENTRUN_LLM_HTTP_CLIENT", "curl", "AGENTRUN_LLM_HTTP_CLIENT must be one of aiohttp, httpx, got 'curl'"),
])
def test_a_bad_value_exits_naming_the_variable(var: str, value: str, message: str) -> None:
    with pytest.raises(SystemExit) as caught:
        llm_from_env(SETTINGS, {"ANTHROPIC_API_KEY": "k", var: value})
    assert message in str(caught.value.code)


def test_no_key_and_no_base_url_exits_saying_what_to_set() -> None:
    with pytest.raises(SystemExit) as caught:
        llm_from_env(SETTINGS, {})
    assert "ANTHROPIC_API_KEY" in str(caught.value.code) and "ANTHROPIC_BASE_URL" in str(caught.value.code)


def test_the_stack_is_retrying_around_a_time_limit() -> None:
    llm = llm_from_env(SETTINGS, {"ANTHROPIC_API_KEY": "k", "AGENTRUN_LLM_MAX_ATTEMPTS": "2",
                                  "AGENTRUN_LLM_TIMEOUT_SECONDS": "9"})
    assert isinstance(llm, Retrying) and llm.max_attempts == 2
    assert isinstance(llm.delegate, TimeLimited) and llm.delegate.seconds == 9.0


async def test_a_base_url_alone_reaches_a_local_server(fake: FakeAnthropic) -> None:
    llm = llm_from_env(SETTINGS, {"ANTHROPIC_BASE_URL": fake.base_url})

    response = await llm.send(LlmRequest("claude-sonnet-4-5", 64, [{"role": "user", "content": "hi"}]))

    assert response.stop_reason == "end_turn" and len(fake.requests) == 1
