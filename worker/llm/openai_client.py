"""The OpenAI-compatible adapter: an `LlmClient` on the official `openai` SDK's Chat Completions.

The step log keeps one canonical form, Anthropic content blocks; this module converts them to Chat
Completions messages on the way out and the answer back to blocks, so a run replays the same way
whichever provider wrote its steps. No cache marks are sent: these servers cache prefixes on their own
(and report it as `prompt_tokens_details.cached_tokens`). The SDK's own retries are off; retrying and
the per-attempt limit are the shared decorators (retry.py, timeout.py).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

import openai
from openai.types.chat import ChatCompletion

from agentrun.worker.core.types import Block, LlmError, LlmRequest, LlmResponse, Message, Usage
from agentrun.worker.llm.anthropic_client import Clock, retry_after, utcnow
from agentrun.worker.llm.errors import truncated

Json = dict[str, Any]

STOP_REASONS: Mapping[str | None, str] = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}
TOOL_ERROR = "[tool error] "
"""Chat Completions has no `is_error` on a tool message: the model is told in the text instead."""


class OpenAiClient:
    """One Chat Completions call per `send`; SDK errors become `LlmError` with the same classes as
    the Anthropic adapter (429 and 5xx retryable, honouring `retry-after`; other 4xx not)."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        max_tokens_param: str = "max_tokens",
        http_timeout: float = 600.0,
        clock: Clock = utcnow,
    ) -> None:
        self._sdk = openai.AsyncOpenAI(
            # Local servers (vLLM, Ollama) want no key, but the SDK refuses to send without one.
            api_key=api_key or "unused", base_url=base_url, default_headers=dict(headers or {}),
            timeout=http_timeout, max_retries=0,
        )
        self._max_tokens_param = max_tokens_param
        self._clock = clock

    @property
    def base_url(self) -> str:
        return str(self._sdk.base_url)

    async def aclose(self) -> None:
        await self._sdk.close()

    async def send(self, request: LlmRequest) -> LlmResponse:
        params: dict[str, Any] = {
            "model": request.model,
            self._max_tokens_param: request.max_tokens,
            "messages": to_chat(request.system, request.messages),
        }
        if request.tools:
            params["tools"] = [to_function(t) for t in request.tools]
        try:
            # The SDK's `chat.completions.create` walks every message against its TypedDicts to transform
            # them, which grows with the conversation (a 200-turn run spent most of its CPU there); ours
            # are plain JSON already, so they go out as they are, through the same client and errors.
            completion = await self._sdk.post("/chat/completions", body=params, cast_to=ChatCompletion)
        except openai.APIStatusError as e:
            raise LlmError(e.status_code, retry_after(e.response.headers, self._clock()), _status_message(e)) from e
        except openai.APIConnectionError as e:  # includes APITimeoutError
            cause = f" ({type(e.__cause__).__name__}: {e.__cause__})" if e.__cause__ is not None else ""
            raise LlmError(-1, None, truncated(f"{type(e).__name__}: {e.message}{cause}")) from e
        return from_chat(completion.model_dump(mode="json"))


def to_function(tool: Json) -> Json:
    """An Anthropic tool definition as a Chat Completions function tool."""
    function: Json = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def to_chat(system: str | None, messages: list[Message]) -> list[Json]:
    """Anthropic messages as Chat Completions messages.

    An assistant turn's text and tool_use blocks become one assistant message with `tool_calls`; a user
    turn's tool_result blocks become `role: tool` messages, first, since they must follow the assistant
    message that asked for them, and its text a user message after them.
    """
    out: list[Json] = [{"role": "system", "content": system}] if system else []
    for message in messages:
        content = message.get("content")
        blocks: list[Block] = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        text = "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
        if message.get("role") == "assistant":
            calls = [
                {"id": b["id"], "type": "function",
                 "function": {"name": b["name"], "arguments": json.dumps(b.get("input") or {}, ensure_ascii=False)}}
                for b in blocks if b.get("type") == "tool_use"
            ]
            turn: Json = {"role": "assistant", "content": text or None}
            if calls:
                turn["tool_calls"] = calls
            out.append(turn)
            continue
        for b in blocks:
            if b.get("type") == "tool_result":
                result = _text_of(b.get("content"))
                out.append({"role": "tool", "tool_call_id": b["tool_use_id"],
                            "content": TOOL_ERROR + result if b.get("is_error") else result})
        if text or not any(b.get("type") == "tool_result" for b in blocks):
            out.append({"role": "user", "content": text})
    return out


def from_chat(completion: Json) -> LlmResponse:
    """A Chat Completions answer as Anthropic content blocks, stop reason and usage.

    Tool call arguments that are not a JSON object are a 502: the server produced a malformed answer,
    and a fresh sample usually does not, so the shared policy retries it.
    """
    choices = completion.get("choices") or []
    if not choices:
        raise LlmError(502, None, "the Chat Completions answer has no choices")
    choice = choices[0]
    message: Json = choice.get("message") or {}
    blocks: list[Block] = []
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    elif message.get("refusal"):
        blocks.append({"type": "text", "text": message["refusal"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments") or "{}"
        try:
            args = json.loads(arguments)
        except ValueError:
            args = None
        if not isinstance(args, dict):
            raise LlmError(502, None, truncated(
                f"tool call {function.get('name')!r} has arguments that are not a JSON object: {arguments}"
            ))
        # Some servers leave out the id; the step log needs one, unique in the run (it is the tool's
        # idempotency key), and stores it, so a replay sees the same.
        blocks.append({"type": "tool_use", "id": call.get("id") or f"call_{uuid.uuid4().hex[:24]}",
                       "name": function.get("name", ""), "input": args})
    if any(b["type"] == "tool_use" for b in blocks):
        stop = "tool_use"  # servers differ on the finish_reason of a turn with tool calls (Ollama says "stop")
    elif message.get("refusal") and not message.get("content"):
        stop = "refusal"
    else:
        stop = STOP_REASONS.get(choice.get("finish_reason"), "end_turn")
    usage = usage_of(completion.get("usage"))
    return LlmResponse(content=blocks, stop_reason=stop, usage=usage,
                       context_tokens=usage.input_tokens + usage.cache_read_input_tokens)


def usage_of(usage: Json | None) -> Usage:
    """`prompt_tokens` counts cached tokens too; they are split out as cache reads, priced apart."""
    usage = usage or {}
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    prompt = int(usage.get("prompt_tokens") or 0)
    return Usage(
        input_tokens=max(prompt - cached, 0),
        output_tokens=int(usage.get("completion_tokens") or 0),
        cache_read_input_tokens=cached,
    )


def _text_of(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text")
    return "" if content is None else str(content)


def _status_message(e: openai.APIStatusError) -> str:
    """The server's `error.message` if the body has one (OpenAI, vLLM, LiteLLM do), else the body as text."""
    body = e.body
    if isinstance(body, dict):
        error = body.get("error", body)
        message = error.get("message") if isinstance(error, dict) else error
        if isinstance(message, str) and message:
            return truncated(message)
    return truncated(e.response.text or e.message)

