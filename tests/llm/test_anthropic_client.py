"""The Anthropic adapter through the real SDK against the fake Messages API: requests, responses, errors."""

from __future__ import annotations

import copy
import datetime
import json

import pytest

from agentrun.worker.core.types import MAX_RETRY_AFTER, LlmError, LlmRequest
from agentrun.worker.llm.anthropic_client import AnthropicClient, retry_after, should_retry, with_message_breakpoints
from agentrun.worker.testing.fake_server import FakeAnthropic, Reply, usage_of
from tests.support.llm import TOOLS
from tests.support.ports import free_port

MODEL = "claude-sonnet-4-5"
EPHEMERAL = {"type": "ephemeral"}


def request(messages: list[dict[str, object]] | None = None, system: str | None = "You triage tickets.", tools=TOOLS) -> LlmRequest:
    return LlmRequest(MODEL, 1024, messages or [{"role": "user", "content": "What is open?"}], system, list(tools))


def breakpoints(body: dict[str, object]) -> int:
    text = json.dumps(body)
    return text.count('"cache_control"')


async def test_a_tool_use_turn_comes_back_as_replayable_blocks(fake: FakeAnthropic, client: AnthropicClient) -> None:
    fake.script(Reply.tool_use("list_tickets", {"status": "open"}, id="toolu_1"))

    response = await client.send(request())

    assert response.stop_reason == "tool_use"
    assert response.content == [{"type": "tool_use", "id": "toolu_1", "name": "list_tickets", "input": {"status": "open"}}]
    json.dumps(response.content)  # stored verbatim as JSON


async def test_a_final_text_turn_with_cache_usage(fake: FakeAnthropic, client: AnthropicClient) -> None:
    fake.script(Reply.text("Three tickets are open.", usage_of(21, 9, cache_write=1500, cache_read=4200)))

    response = await client.send(request())

    assert response.stop_reason == "end_turn"
    assert response.content == [{"type": "text", "text": "Three tickets are open."}]
    u = response.usage
    assert (u.input_tokens, u.output_tokens, u.cache_creation_input_tokens, u.cache_read_input_tokens) == (21, 9, 1500, 4200)
    assert u.total == 21 + 9 + 1500 + 4200


async def test_missing_cache_counts_are_zero(fake: FakeAnthropic, client: AnthropicClient) -> None:
    fake.script(Reply(body={"type": "message", "role": "assistant", "content": [{"type": "text", "text": "hi"}],
                            "stop_reason": "end_turn", "usage": {"input_tokens": 4, "output_tokens": 2}}))

    u = (await client.send(request())).usage

    assert (u.cache_creation_input_tokens, u.cache_read_input_tokens) == (0, 0)


async def test_the_request_carries_system_blocks_tools_and_a_breakpoint_on_the_newest_message(
    fake: FakeAnthropic, client: AnthropicClient
) -> None:
    await client.send(request())

    (body,) = fake.requests
    assert body["model"] == MODEL and body["max_tokens"] == 1024
    assert body["system"] == [{"type": "text", "text": "You triage tickets.", "cache_control": EPHEMERAL}]
    assert body["tools"] == TOOLS
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "What is open?", "cache_control": EPHEMERAL}]}
    ]


async def test_a_long_conversation_marks_the_newest_and_the_previous_request_end(
    fake: FakeAnthropic, client: AnthropicClient
) -> None:
    messages = [
        {"role": "user", "content": "What is open?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "list_tickets", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "A, B"}]},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t2", "name": "close_ticket", "input": {}},
            {"type": "tool_use", "id": "t3", "name": "close_ticket", "input": {}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t2", "content": "closed A"},
            {"type": "tool_result", "tool_use_id": "t3", "content": "closed B"},
        ]},
    ]
    before = copy.deepcopy(messages)

    await client.send(request(messages))

    assert messages == before, "the caller's messages were changed"
    sent = fake.requests[0]["messages"]
    assert sent[4]["content"][-1]["cache_control"] == EPHEMERAL
    assert "cache_control" not in sent[4]["content"][0]
    assert sent[2]["content"][-1]["cache_control"] == EPHEMERAL
    assert sent[0] == messages[0] and sent[1] == messages[1] and sent[3] == messages[3]
    assert breakpoints(fake.requests[0]) == 3  # the API allows 4


async def test_without_a_system_prompt_the_last_tool_is_the_stable_prefix(fake: FakeAnthropic, client: AnthropicClient) -> None:
    await client.send(request(system=None))

    body = fake.requests[0]
    assert "system" not in body
    assert body["tools"][-1]["cache_control"] == EPHEMERAL
    assert "cache_control" not in TOOLS[-1]


async def test_without_tools_none_are_sent(fake: FakeAnthropic, client: AnthropicClient) -> None:
    await client.send(request(tools=()))

    assert "tools" not in fake.requests[0]


def test_breakpoints_skip_an_empty_text_block() -> None:
    messages = [{"role": "user", "content": ""}]
    assert with_message_breakpoints(messages) == messages


async def test_a_400_carries_the_api_message(fake: FakeAnthropic, client: AnthropicClient) -> None:
    fake.script(Reply.bad_request("messages.0.content: prompt is too long: 210000 tokens > 200000 maximum"))

    with pytest.raises(LlmError) as caught:
        await client.send(request())

    e = caught.value
    assert e.status == 400 and not e.retryable and e.retry_after is None
    assert e.message == "messages.0.content: prompt is too long: 210000 tokens > 200000 maximum"


@pytest.mark.parametrize(("reply", "status"), [
    (Reply.rate_limited(7), 429), (Reply.overloaded(), 529), (Reply.server_error(), 500),
    (Reply.error(401, "invalid x-api-key", "authentication_error"), 401),
])
async def test_status_errors_keep_their_status(fake: FakeAnthropic, client: AnthropicClient, reply: Reply, status: int) -> None:
    fake.script(reply)

    with pytest.raises(LlmError) as caught:
        await client.send(request())

    assert caught.value.status == status
    assert caught.value.retryable == (status != 401)
    assert caught.value.message == reply.body["error"]["message"]


@pytest.mark.parametrize(("status", "retryable"), [
    (400, False), (401, False), (403, False), (404, False), (413, False), (422, False), (418, False), (451, False),
    (408, True), (409, True), (429, True), (500, True), (502, True), (503, True), (504, True), (529, True),
])
async def test_which_statuses_are_retryable(
    fake: FakeAnthropic, client: AnthropicClient, status: int, retryable: bool
) -> None:
    fake.script(Reply.error(status, f"status {status}"))

    with pytest.raises(LlmError) as caught:
        await client.send(request())

    assert caught.value.status == status and caught.value.retryable is retryable


@pytest.mark.parametrize(("status", "header", "retryable"), [
    (529, "false", False), (500, "false", False), (429, "FALSE", False),
    (400, "true", True), (404, "true", True), (529, "true", True), (400, "maybe", False), (503, "", True),
])
async def test_x_should_retry_overrides_the_status(
    fake: FakeAnthropic, client: AnthropicClient, status: int, header: str, retryable: bool
) -> None:
    reply = Reply.error(status, "told by the server")
    fake.script(Reply(status=reply.status, body=reply.body, headers={"x-should-retry": header}))

    with pytest.raises(LlmError) as caught:
        await client.send(request())

    assert caught.value.status == status and caught.value.retryable is retryable


@pytest.mark.parametrize("value", ["inf", "1e12", "86400", "Fri, 31 Dec 9999 23:59:59 GMT"])
async def test_an_absurd_retry_after_is_capped(fake: FakeAnthropic, client: AnthropicClient, value: str) -> None:
    reply = Reply.rate_limited()
    fake.script(Reply(status=429, body=reply.body, headers={"retry-after": value}))

    with pytest.raises(LlmError) as caught:
        await client.send(request())

    assert caught.value.retry_after == MAX_RETRY_AFTER


async def test_retry_after_comes_from_the_header(fake: FakeAnthropic, client: AnthropicClient) -> None:
    fake.script(Reply.rate_limited(7))

    with pytest.raises(LlmError) as caught:
        await client.send(request())

    assert caught.value.retry_after == 7.0


async def test_a_long_non_json_body_is_truncated(fake: FakeAnthropic, client: AnthropicClient) -> None:
    fake.script(Reply(status=502, body={"detail": "<html>" + "x" * 5000}))

    with pytest.raises(LlmError) as caught:
        await client.send(request())

    assert caught.value.status == 502 and caught.value.retryable
    assert caught.value.message.startswith('{"detail": "<html>xxx') and len(caught.value.message) <= 500


async def test_a_dropped_connection_is_status_minus_one(fake: FakeAnthropic, client: AnthropicClient) -> None:
    fake.script(Reply.disconnect())

    with pytest.raises(LlmError) as caught:
        await client.send(request())

    # Ours: a connection error, retryable, with no server to name a delay; the words are the SDK's.
    assert (caught.value.status, caught.value.retryable, caught.value.retry_after) == (-1, True, None)
    assert caught.value.message


async def test_nothing_listening_is_status_minus_one() -> None:
    port = free_port()
    client = AnthropicClient(api_key="k", base_url=f"http://127.0.0.1:{port}", http_timeout=5.0)
    try:
        with pytest.raises(LlmError) as caught:
            await client.send(request())
    finally:
        await client.aclose()
    assert caught.value.status == -1 and caught.value.retryable


NOW = datetime.datetime(2025, 6, 1, 12, 0, 0, tzinfo=datetime.UTC)


@pytest.mark.parametrize(("headers", "expected"), [
    ({"retry-after": "7"}, 7.0),
    ({"retry-after": "1.5"}, 1.5),
    ({"retry-after": "Sun, 01 Jun 2025 12:00:30 GMT"}, 30.0),
    ({"retry-after": "Sun, 01 Jun 2025 11:59:00 GMT"}, 0.0),  # already past
    ({"retry-after": "-3"}, 0.0),
    ({"retry-after": "soon"}, None),
    ({"retry-after-ms": "2500", "retry-after": "9"}, 2.5),
    ({}, None),
    ({"retry-after": "inf"}, MAX_RETRY_AFTER),
    ({"retry-after": "Infinity"}, MAX_RETRY_AFTER),
    ({"retry-after": "-inf"}, 0.0),
    ({"retry-after": "nan"}, None),
    ({"retry-after": "1e400"}, MAX_RETRY_AFTER),  # overflows to inf
    ({"retry-after": "3600"}, MAX_RETRY_AFTER),
    ({"retry-after": "Sun, 01 Jun 2025 13:00:00 GMT"}, MAX_RETRY_AFTER),  # an hour ahead
    ({"retry-after": "Fri, 31 Dec 9999 23:59:59 GMT"}, MAX_RETRY_AFTER),
    ({"retry-after-ms": "inf"}, MAX_RETRY_AFTER),
    ({"retry-after-ms": "nan", "retry-after": "4"}, 4.0),  # an unusable ms header falls back to seconds
    ({"retry-after-ms": "-100"}, 0.0),
])
def test_retry_after_parsing(headers: dict[str, str], expected: float | None) -> None:
    assert retry_after(headers, NOW) == expected


@pytest.mark.parametrize(("value", "expected"), [
    (float("inf"), MAX_RETRY_AFTER), (1e9, MAX_RETRY_AFTER), (-5.0, 0.0), (float("nan"), None), (7.0, 7.0), (None, None),
])
def test_an_llm_error_never_carries_an_absurd_retry_after(value: float | None, expected: float | None) -> None:
    assert LlmError(429, value).retry_after == expected


def test_an_llm_error_can_carry_the_servers_verdict() -> None:
    assert LlmError(529).retryable and not LlmError(529, retryable=False).retryable
    assert not LlmError(400).retryable and LlmError(400, retryable=True).retryable
    assert LlmError(-1).retryable  # no answer at all: a connection error or a timeout


@pytest.mark.parametrize(("headers", "expected"), [
    ({"x-should-retry": "true"}, True), ({"x-should-retry": "false"}, False), ({"x-should-retry": " True "}, True),
    ({"x-should-retry": "1"}, None), ({}, None),
])
def test_should_retry_parsing(headers: dict[str, str], expected: bool | None) -> None:
    assert should_retry(headers) is expected
