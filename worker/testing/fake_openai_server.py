"""A small local server speaking OpenAI Chat Completions (`POST /v1/chat/completions`), for tests and the demo.

Point the real `openai` SDK (or a providers-file endpoint with `baseUrl: http://HOST:PORT/v1`) at it.
It answers from a queue of scripted replies (completions, or faults such as 429 with retry-after, 500
and 400), else from a stateless agent that asks for one or more tool calls, then summarises their
results. It refuses what OpenAI refuses where it matters (a tool message that answers no tool call,
a tool call left unanswered, unknown fields such as Anthropic's `cache_control`) and logs every
JSON body it received. Run it alone with `python -m agentrun.worker.testing.fake_openai_server --port 8089`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from agentrun.worker.testing.fake_server import (
    FakeApi,
    Json,
    Managed,
    Reply,
    Responder,
    count_tokens,
    long_turn,
    serve_until_signalled,
)

ROLES = ("system", "developer", "user", "assistant", "tool")


def completion(
    content: str | None = None,
    tool_calls: Sequence[tuple[str, str, Json]] = (),
    finish_reason: str | None = None,
    usage: Mapping[str, Any] | None = None,
    refusal: str | None = None,
) -> Reply:
    """A Chat Completions answer: text and/or tool calls `(id, name, arguments)`. The finish reason is
    `tool_calls` when there are calls, else `stop`, unless given."""
    message: Json = {"role": "assistant", "content": content, "refusal": refusal}
    if tool_calls:
        message["tool_calls"] = [
            {"id": id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            for id, name, args in tool_calls
        ]
    return Reply(body={
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop")}],
        "usage": dict(usage or usage_of(10, 5)),
    })


def usage_of(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    """OpenAI's usage: `prompt_tokens` includes the `cached_tokens` read from its prompt cache."""
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def error(status: int, message: str, type: str = "server_error", retry_after: float | None = None) -> Reply:
    headers = {"retry-after": f"{retry_after:g}"} if retry_after is not None else {}
    return Reply(status=status, body={"error": {"message": message, "type": type, "param": None, "code": None}},
                 headers=headers)


def rate_limited(retry_after: float | None = None) -> Reply:
    return error(429, "Rate limit reached for requests per minute.", "requests", retry_after)


def bad_request(message: str) -> Reply:
    return error(400, message, "invalid_request_error")


def _tokens(value: Any) -> int:
    return max(1, len(json.dumps(value)) // 4)


@dataclasses.dataclass(frozen=True)
class ChatAgentResponder:
    """A stateless agent: while the conversation has no tool message, asks for `tool` `parallel` times at
    once (ids `call_<turn>_<part>`); then answers with text summarising the tool results.

    Stateless, so concurrent runs can share it and a resumed run gets the same answers. Usage counts
    the conversation before the newest message as read from the prompt cache, as OpenAI reports it.
    """

    tool: str = "list_tickets"
    input: Json = dataclasses.field(default_factory=lambda: {"status": "open"})
    parallel: int = 1

    def __call__(self, body: Json) -> Reply:
        messages: list[Json] = body.get("messages", [])
        cached = _tokens(messages[:-1]) if len(messages) > 1 else 0
        prompt = cached + _tokens(messages[-1:]) + _tokens(body.get("tools", []))
        results = [m for m in messages if m.get("role") == "tool"]
        offered = any((t.get("function") or {}).get("name") == self.tool for t in body.get("tools", []))
        if not results and offered:
            turn = sum(1 for m in messages if m.get("role") == "assistant")
            calls = [(f"call_{turn:02d}_{part}", self.tool, dict(self.input, part=part) if self.parallel > 1
                      else self.input) for part in range(self.parallel)]
            return completion(None, calls, usage=usage_of(prompt, 20 * self.parallel, cached))
        if results:
            text = f"Summary of {self.tool}: " + " | ".join(str(r.get("content", ""))[:200] for r in results)
        else:
            text = f"No {self.tool} tool was offered, so here is an answer without it."
        return completion(text, usage=usage_of(prompt, _tokens(text), cached))


@dataclasses.dataclass(frozen=True)
class LongChatResponder:
    """fake_server.LongResponder in Chat Completions: asks for `tool` (id `call_long_N`) until `turns`, the turn
    found in the request's ids; a request with no tools (a summarising call) gets a summary naming the newest."""

    tool: str = "fetch_page"
    turns: int = 200

    def __call__(self, body: Json) -> Reply:
        turn = long_turn(body)
        usage = usage_of(count_tokens(body), 12)
        if not body.get("tools"):
            return completion(f"Summary: {turn} tool calls so far; the newest is call_long_{turn - 1}.", usage=usage)
        if turn >= self.turns:
            return completion(f"done after {self.turns} tool turns", usage=usage)
        return completion(None, [(f"call_long_{turn}", self.tool, {"turn": turn})], usage=usage)


def check_chat(body: Any) -> str | None:
    """What OpenAI would refuse with a 400, for the mistakes a client of it can make; None if fine."""
    if not isinstance(body, dict):
        return "We could not parse the JSON body of your request."
    for field in ("model", "messages"):
        if field not in body:
            return f"Missing required parameter: '{field}'."
    if unknown := sorted(set(body) - KNOWN_FIELDS):
        return f"Unrecognized request argument supplied: {unknown[0]}"
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        return "Invalid 'messages': empty array. Expected an array with minimum length 1."
    if "cache_control" in json.dumps(messages):
        return "Unrecognized field 'cache_control' in messages."
    waiting: set[str] = set()  # tool calls of the last assistant message not answered yet
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ROLES:
            return f"Invalid value for 'messages[{i}].role': {role!r}. Supported values are: {', '.join(ROLES)}."
        if role == "tool":
            if m.get("tool_call_id") not in waiting:
                return (f"Invalid parameter: messages with role 'tool' must be a response to a preceeding message "
                        f"with 'tool_calls' (messages[{i}].tool_call_id {m.get('tool_call_id')!r}).")
            waiting.discard(m["tool_call_id"])
            if not isinstance(m.get("content"), str):
                return f"Invalid type for 'messages[{i}].content': expected a string."
            continue
        if waiting:
            return ("An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                    f"'tool_call_id'. The following tool_call_ids did not have response messages: "
                    f"{', '.join(sorted(waiting))}")
        if role == "assistant":
            calls = m.get("tool_calls") or []
            for c in calls:
                try:
                    json.loads(c["function"]["arguments"])
                except (KeyError, TypeError, ValueError):
                    return f"Invalid 'messages[{i}].tool_calls': each needs function.name and JSON arguments."
            waiting = {c["id"] for c in calls}
            if m.get("content") is None and not calls:
                return f"Invalid 'messages[{i}]': an assistant message needs content or tool_calls."
    for t in body.get("tools", []):
        if t.get("type") != "function" or "name" not in (t.get("function") or {}):
            return "Invalid 'tools': each tool needs type 'function' and function.name."
    for field in ("max_tokens", "max_completion_tokens"):
        if field in body and (not isinstance(body[field], int) or body[field] < 1):
            return f"Invalid '{field}': expected an integer of at least 1."
    return None


KNOWN_FIELDS = frozenset({
    "model", "messages", "max_tokens", "max_completion_tokens", "tools", "tool_choice", "parallel_tool_calls",
    "temperature", "top_p", "stop", "stream", "stream_options", "n", "seed", "user", "metadata",
    "response_format", "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs", "store",
})


class FakeOpenAi(FakeApi):
    """The server. `script(...)` queues replies (`completion`, `rate_limited`, `error`, ... or any `Reply`);
    then `responder` answers. Clients use `base_url + "/v1"` (the `v1_url` property)."""

    kind = "fake Chat Completions API"

    def __init__(
        self, responder: Responder | None = None, host: str = "127.0.0.1", port: int = 0,
        context_window: int | None = None,
    ) -> None:
        super().__init__(responder or ChatAgentResponder(), host, port)
        self.context_window = context_window
        self.input_tokens: list[int] = []  # the prompt each request was counted at

    def manage(self, body: Json, request: web.Request) -> Managed:
        """The window, refused as OpenAI refuses it (400 `context_length_exceeded`)."""
        n = count_tokens(body)
        self.input_tokens.append(n)
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        completion_tokens = limit if isinstance(limit, int) else 0
        if self.context_window is not None and n + completion_tokens > self.context_window:
            return Managed(body, Reply(status=400, body={"error": {
                "message": f"This model's maximum context length is {self.context_window} tokens. However, you "
                f"requested {n + completion_tokens} tokens ({n} in the messages, {completion_tokens} in the "
                "completion). Please reduce the length of the messages or completion.",
                "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}))
        return Managed(body)

    @property
    def v1_url(self) -> str:
        return f"{self.base_url}/v1"

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self.answer)

    def check(self, body: Any, request: web.Request) -> str | None:
        return check_chat(body)

    def refuse(self, problem: str) -> Reply:
        return bad_request(problem)

    def complete(self, payload: Json, body: Json, request: web.Request) -> None:
        payload.setdefault("id", f"chatcmpl-{uuid.uuid4().hex[:24]}")
        payload.setdefault("object", "chat.completion")
        payload.setdefault("created", int(time.time()))
        payload.setdefault("model", body["model"])


async def _serve(args: argparse.Namespace, tool_input: Json) -> None:
    server = FakeOpenAi(ChatAgentResponder(args.tool, tool_input, args.parallel), args.host, args.port,
                        context_window=args.context_window)
    await serve_until_signalled(server, "fake Chat Completions API listening on {server.v1_url}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m agentrun.worker.testing.fake_openai_server",
        description="A local OpenAI Chat Completions API for demos and tests: asks for tool calls, then "
        "summarises their results. Declare it in AGENTRUN_PROVIDERS as an endpoint of kind openai with "
        "baseUrl http://HOST:PORT/v1, and submit runs with the model <name>/<any model>.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8089, help="port, 0 for any free one (default: 8089)")
    parser.add_argument("--tool", default="list_tickets", help="the tool the model asks for (default: list_tickets)")
    parser.add_argument("--tool-input", default='{"status": "open"}', metavar="JSON",
                        help='arguments of that tool call (default: {"status": "open"})')
    parser.add_argument("--parallel", type=int, default=1, metavar="N",
                        help="tool calls asked for at once, in one turn (default: 1)")
    parser.add_argument("--context-window", type=int, default=None, metavar="TOKENS",
                        help="refuse a request over this many tokens with OpenAI's 400 (default: no limit)")
    args = parser.parse_args(argv)
    try:
        tool_input = json.loads(args.tool_input)
    except ValueError as e:
        parser.error(f"--tool-input is not JSON: {e}")
    if not isinstance(tool_input, dict):
        parser.error("--tool-input must be a JSON object")
    if args.parallel < 1:
        parser.error("--parallel must be at least 1")
    asyncio.run(_serve(args, tool_input))


if __name__ == "__main__":
    main()
