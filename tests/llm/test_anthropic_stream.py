"""The Anthropic adapter's own reading of answers: streamed and not, on both SDK transports, and what a
broken answer becomes (an `LlmError`, never a stack trace)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import orjson
import pytest
from aiohttp import web

from agentrun.worker.core.types import LlmError, LlmRequest
from agentrun.worker.llm.anthropic_client import AnthropicClient, HttpClient
from agentrun.worker.testing.fake_server import FakeAnthropic, Reply, usage_of
from tests.support.llm import TOOLS

MODEL = "claude-sonnet-4-5"


def request(on_text: Callable[[str], None] | None = None) -> LlmRequest:
    return LlmRequest(MODEL, 1024, [{"role": "user", "content": "What is open?"}], "You triage.", list(TOOLS),
                      on_text=on_text)


@pytest.fixture(params=["aiohttp", "httpx"])
async def any_client(request: pytest.FixtureRequest, fake: FakeAnthropic) -> AsyncIterator[AnthropicClient]:
    transport: HttpClient = request.param
    c = AnthropicClient(api_key="test-key", base_url=fake.base_url, http_timeout=10.0, http_client=transport)
    try:
        yield c
    finally:
        await c.aclose()


TURNS = [
    Reply.tool_use("list_tickets", {"status": "open", "tags": ["a", None], "limit": None}, id="toolu_1",
                   usage=usage_of(12, 30, cache_write=100, cache_read=2000)),
    Reply.text("Three tickets are open: #1, #2 and #3.", usage_of(3, 11)),
    Reply.message([{"type": "text", "text": "Let me look."},
                   {"type": "tool_use", "id": "toolu_2", "name": "close_ticket", "input": {}}], "tool_use"),
]


@pytest.mark.parametrize("turn", TURNS, ids=["tool_use", "text", "text-and-tool_use"])
async def test_a_streamed_answer_is_the_answer_not_streamed(
    fake: FakeAnthropic, any_client: AnthropicClient, turn: Reply
) -> None:
    fake.script(turn, turn)
    fragments: list[str] = []

    plain = await any_client.send(request())
    streamed = await any_client.send(request(fragments.append))

    assert fake.requests[0].get("stream") is None and fake.requests[1]["stream"] is True
    assert streamed.content == plain.content
    assert (streamed.stop_reason, streamed.usage, streamed.model) == (plain.stop_reason, plain.usage, plain.model)
    assert streamed.id is not None and plain.id is not None
    assert "".join(fragments) == "".join(b.get("text", "") for b in plain.content if b["type"] == "text")
    if "tool_use" in [b["type"] for b in plain.content]:
        assert len(fragments) <= 3  # a tool call's JSON is not text
    # Null fields of a block are dropped, as the SDK's models dump them; the tool's own input is kept whole.
    assert all(v is not None for block in plain.content for v in block.values())


async def test_the_request_body_is_the_messages_api_json(fake: FakeAnthropic, any_client: AnthropicClient) -> None:
    fake.script(Reply.text("ok"))
    await any_client.send(request())
    received = fake.received[0]
    assert received.path == "/v1/messages"
    assert received.headers["content-type"] == "application/json"
    assert "test-key" in (received.headers.get("x-api-key", "") + received.headers.get("authorization", ""))
    assert "anthropic-version" in received.headers and received.headers["x-stainless-timeout"] == "10.0"
    assert fake.requests[0]["system"][0]["cache_control"] == {"type": "ephemeral"}


class RawServer:
    """Answers every POST /v1/messages with the status, content type and bytes set last."""

    def __init__(self) -> None:
        self.status, self.content_type, self.body = 200, "text/event-stream", b""
        self.runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/messages", self.answer)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        host, port = self.runner.addresses[0][:2]
        return f"http://{host}:{port}"

    async def answer(self, request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=self.status, body=self.body, headers={"Content-Type": self.content_type})


@pytest.fixture
async def raw() -> AsyncIterator[tuple[RawServer, AnthropicClient]]:
    server = RawServer()
    url = await server.start()
    client = AnthropicClient(api_key="k", base_url=url, http_timeout=10.0)
    try:
        yield server, client
    finally:
        await client.aclose()
        assert server.runner is not None
        await server.runner.cleanup()


def sse(*events: tuple[str, dict[str, object]], newline: bytes = b"\n") -> bytes:
    return b"".join(
        b"event: " + name.encode() + newline + b"data: " + orjson.dumps({"type": name, **data}) + newline + newline
        for name, data in events
    )


START = ("message_start", {"message": {"id": "msg_1", "type": "message", "role": "assistant", "model": MODEL,
                                       "content": [], "stop_reason": None,
                                       "usage": {"input_tokens": 7, "output_tokens": 1}}})
STOP = ("message_stop", {})


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"], ids=["LF", "CRLF"])
async def test_pings_comments_thinking_and_split_tool_json_are_read(
    raw: tuple[RawServer, AnthropicClient], newline: bytes
) -> None:
    server, client = raw
    server.body = b": a comment line" + newline + newline + sse(
        START,
        ("ping", {}),
        ("content_block_start", {"index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
        ("content_block_delta", {"index": 0, "delta": {"type": "thinking_delta", "thinking": "Tickets "}}),
        ("content_block_delta", {"index": 0, "delta": {"type": "thinking_delta", "thinking": "first."}}),
        ("content_block_delta", {"index": 0, "delta": {"type": "signature_delta", "signature": "c2ln"}}),
        ("content_block_stop", {"index": 0}),
        ("content_block_start", {"index": 1, "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"index": 1, "delta": {"type": "text_delta", "text": "Looking…\n"}}),
        ("content_block_stop", {"index": 1}),
        ("content_block_start", {"index": 2, "content_block": {"type": "tool_use", "id": "toolu_9",
                                                               "name": "list_tickets", "input": {}}}),
        ("content_block_delta", {"index": 2, "delta": {"type": "input_json_delta", "partial_json": '{"sta'}}),
        ("content_block_delta", {"index": 2, "delta": {"type": "input_json_delta", "partial_json": 'tus": "open"}'}}),
        ("content_block_stop", {"index": 2}),
        ("message_delta", {"delta": {"stop_reason": "tool_use", "stop_sequence": None},
                           "usage": {"output_tokens": 42, "cache_read_input_tokens": 300}}),
        STOP,
        newline=newline,
    )
    fragments: list[str] = []

    response = await client.send(request(fragments.append))

    assert fragments == ["Looking…\n"]
    assert response.content == [
        {"type": "thinking", "thinking": "Tickets first.", "signature": "c2ln"},
        {"type": "text", "text": "Looking…\n"},
        {"type": "tool_use", "id": "toolu_9", "name": "list_tickets", "input": {"status": "open"}},
    ]
    assert response.stop_reason == "tool_use" and response.id == "msg_1"
    u = response.usage
    assert (u.input_tokens, u.output_tokens, u.cache_read_input_tokens) == (7, 42, 300)


@pytest.mark.parametrize(("kind", "status", "retryable"), [
    ("overloaded_error", 529, True), ("api_error", 500, True), ("invalid_request_error", 400, False),
    ("something_new", 500, True),
])
async def test_an_error_event_midway_is_the_status_its_type_stands_for(
    raw: tuple[RawServer, AnthropicClient], kind: str, status: int, retryable: bool
) -> None:
    server, client = raw
    server.body = sse(START, ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
                      ("error", {"error": {"type": kind, "message": f"{kind} happened"}}))

    with pytest.raises(LlmError) as caught:
        await client.send(request(lambda text: None))

    assert (caught.value.status, caught.value.retryable) == (status, retryable)
    assert f"{kind} happened" in caught.value.message


@pytest.mark.parametrize(("body", "why"), [
    (sse(START, ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})),
     "ended before message_stop"),
    (b"", "ended before message_stop"),
    (b"data: <html>\n\n", "not JSON: <html>"),
    (sse(("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "x"}})), "before message_start"),
    (sse(START, ("content_block_delta", {"index": 3, "delta": {"type": "text_delta", "text": "x"}})),
     "block never started"),
], ids=["cut-short", "empty", "not-json", "no-start", "unknown-block"])
async def test_a_broken_stream_is_a_retryable_error(
    raw: tuple[RawServer, AnthropicClient], body: bytes, why: str
) -> None:
    server, client = raw
    server.body = body

    with pytest.raises(LlmError) as caught:
        await client.send(request(lambda text: None))

    assert caught.value.status == -1 and caught.value.retryable
    assert why in caught.value.message


@pytest.mark.parametrize(("body", "why"), [
    (b"<html>proxy says hi</html>", "not JSON: <html>proxy says hi</html>"),
    (b"[1, 2]", "must be a JSON object, got list"),
    (b'{"type": "message", "content": "hi"}', "content must be a list of blocks"),
], ids=["html", "list", "content-not-blocks"])
async def test_an_unreadable_answer_is_a_retryable_error(
    raw: tuple[RawServer, AnthropicClient], body: bytes, why: str
) -> None:
    server, client = raw
    server.content_type, server.body = "application/json", body

    with pytest.raises(LlmError) as caught:
        await client.send(request())

    assert caught.value.status == -1 and caught.value.retryable and why in caught.value.message


async def test_odd_usage_and_ids_are_read_as_nothing(raw: tuple[RawServer, AnthropicClient]) -> None:
    server, client = raw
    server.content_type = "application/json"
    server.body = orjson.dumps({"id": 5, "model": None, "content": [], "stop_reason": 3,
                                "usage": {"input_tokens": "many", "output_tokens": -2, "cache_read_input_tokens": True}})

    response = await client.send(request())

    assert (response.id, response.model, response.stop_reason) == (None, None, None)
    assert response.usage.total == 0


async def test_an_error_status_on_a_stream_keeps_its_status_and_headers(raw: tuple[RawServer, AnthropicClient]) -> None:
    server, client = raw
    server.status, server.content_type = 529, "application/json"
    server.body = orjson.dumps({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})

    with pytest.raises(LlmError) as caught:
        await client.send(request(lambda text: None))

    assert (caught.value.status, caught.value.message, caught.value.retryable) == (529, "Overloaded", True)


async def test_a_request_that_is_not_json_is_refused_without_being_sent(
    fake: FakeAnthropic, client: AnthropicClient
) -> None:
    bad = LlmRequest(MODEL, 1024, [{"role": "user", "content": "lone \udc80 surrogate"}])

    with pytest.raises(LlmError) as caught:
        await client.send(bad)

    assert caught.value.status == 400 and not caught.value.retryable
    assert "cannot be sent as JSON" in caught.value.message and fake.requests == []


def test_an_unknown_transport_is_refused() -> None:
    with pytest.raises(ValueError, match="http_client must be one of aiohttp, httpx"):
        AnthropicClient(api_key="k", http_client="curl")  # type: ignore[arg-type]


BIG_INPUTS = {"n": 2**70, "m": -(2**63) - 1, "top": 2**64 - 1, "low": -(2**63), "f": 0.1, "s": "1234567890123456789012"}


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
async def test_integers_beyond_64_bits_reach_the_answer_exactly(
    fake: FakeAnthropic, any_client: AnthropicClient, streamed: bool
) -> None:
    """orjson reads 2**70 as the float 1.18e21, which would hide it from the refusal of such integers
    (replay): an answer holding one is read by the standard library, every number as it was written."""
    fake.script(Reply.tool_use("list_tickets", BIG_INPUTS, id="toolu_big"))

    answer = await any_client.send(request(print if streamed else None))

    (block,) = answer.content
    assert block["input"] == BIG_INPUTS
    assert all(type(block["input"][k]) is int for k in ("n", "m", "top", "low"))


async def test_a_streamed_compaction_block_its_usage_iterations_and_edits_are_read(
    raw: tuple[RawServer, AnthropicClient]
) -> None:
    """Server-side compaction (contextManagement `server`): the block is built from its deltas and kept as
    sent, the compaction's tokens (only in `iterations`) are billed too, and the window the model saw is the
    message iteration's input."""
    server, client = raw
    server.body = sse(
        START,
        ("content_block_start", {"index": 0, "content_block": {"type": "compaction", "content": None}}),
        ("content_block_delta", {"index": 0, "delta": {"type": "compaction_delta", "content": "Summary: "}}),
        ("content_block_delta", {"index": 0, "delta": {"type": "compaction_delta", "content": "two pages read.",
                                                        "encrypted_content": "b3BhcXVl"}}),
        ("content_block_stop", {"index": 0}),
        ("content_block_start", {"index": 1, "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"index": 1, "delta": {"type": "text_delta", "text": "Going on."}}),
        ("content_block_stop", {"index": 1}),
        ("message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None},
                           "context_management": {"applied_edits": [
                               {"type": "clear_tool_uses_20250919", "cleared_tool_uses": 4,
                                "cleared_input_tokens": 900}]},
                           "usage": {"input_tokens": 700, "output_tokens": 12, "cache_read_input_tokens": 50,
                                     "iterations": [
                                         {"type": "compaction", "input_tokens": 15000, "output_tokens": 300,
                                          "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
                                         {"type": "message", "input_tokens": 700, "output_tokens": 12,
                                          "cache_creation_input_tokens": 0, "cache_read_input_tokens": 50}]}}),
        STOP,
    )
    response = await client.send(request(lambda _: None))
    assert response.content[0] == {"type": "compaction", "content": "Summary: two pages read.",
                                   "encrypted_content": "b3BhcXVl"}
    u = response.usage
    assert (u.input_tokens, u.output_tokens, u.cache_read_input_tokens) == (15700, 312, 50)
    assert response.context_tokens == 750
    assert response.applied_edits[0]["cleared_tool_uses"] == 4


def test_the_server_strategy_asks_for_compaction_and_clearing_and_a_summary_gets_a_breakpoint() -> None:
    from agentrun.worker.core.types import ServerContext
    from agentrun.worker.llm.anthropic_client import request_params

    messages = [{"role": "user", "content": "summary"}, {"role": "assistant", "content": [{"type": "text", "text": "a"}]},
                {"role": "user", "content": "b"}, {"role": "assistant", "content": [{"type": "text", "text": "c"}]},
                {"role": "user", "content": "d"}]
    params = request_params(LlmRequest(MODEL, 1024, messages, "sys", server_context=ServerContext(12_000, 2),
                                       stable_messages=1))
    assert params["context_management"] == {"edits": [
        {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 12_000},
         "keep": {"type": "tool_uses", "value": 2}},
        {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 12_000}},
    ]}
    marked = [i for i, m in enumerate(params["messages"]) if isinstance(m["content"], list)
              and "cache_control" in m["content"][-1]]
    assert marked == [0, 2, 4]  # after the summary, where the last request ended, and the newest
