"""The Anthropic adapter: an `LlmClient` on the official SDK's `AsyncAnthropic`, with prompt-cache breakpoints.

Retrying and the per-attempt time limit are decorators around it (retry.py, timeout.py): the SDK's own
retries are off, so exactly one HTTP request is made per `send`.

Against the Messages API itself the SDK still builds, authenticates, sends and times out each request
and turns every error status into its typed error, but the body is sent as orjson bytes and the answer
(JSON, or the server-sent events of a stream) is read here into plain dicts: the SDK's request walk and
its pydantic models (a snapshot per streamed event) cost a production worker more CPU than everything
else in a step (bench/README.md, B9). Bedrock's and Vertex's clients reshape the request and speak
their own stream formats, so with them the SDK's `messages` resource does all of it.
"""

from __future__ import annotations

import datetime
import email.utils
import math
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import anthropic
import httpx2
import orjson

from agentrun.worker.core.replay import exact_json
from agentrun.worker.core.types import (
    HTTP_CLIENTS,
    Block,
    HttpClient,
    LlmError,
    LlmRequest,
    LlmResponse,
    Message,
    Usage,
    sane_retry_after,
)
from agentrun.worker.llm.errors import MAX_ERROR_CHARS as MAX_ERROR_CHARS
from agentrun.worker.llm.errors import Unreadable as Unreadable
from agentrun.worker.llm.errors import truncated

EPHEMERAL: dict[str, str] = {"type": "ephemeral"}

JSON_HEADERS = {"Content-Type": "application/json"}

COMPACTION_BETA = "compact-2026-01-12"
CONTEXT_EDITING_BETA = "context-management-2025-06-27"
SERVER_CONTEXT_BETAS = (COMPACTION_BETA, CONTEXT_EDITING_BETA)
"""The betas of contextManagement `server`: server-side compaction (`compact_20260112`) and context editing
(`clear_tool_uses_20250919`), sent together; the API clears old tool results first and compacts what is
left when it still passes the trigger."""

# The status an `error` event in a stream stands for (the stream itself began with a 200), by its type,
# so that a stream cut by overload is retried like a 529 answer would be.
STREAM_ERROR_STATUS = {
    "invalid_request_error": 400, "authentication_error": 401, "permission_error": 403, "not_found_error": 404,
    "request_too_large": 413, "rate_limit_error": 429, "api_error": 500, "overloaded_error": 529,
}

Clock = Callable[[], datetime.datetime]
AnthropicSdk = anthropic.AsyncAnthropic | anthropic.AsyncAnthropicBedrock | anthropic.AsyncAnthropicVertex


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class AnthropicClient:
    """One Messages API call per `send`; SDK errors become `LlmError`. A request with `on_text` is streamed.

    `api_key` and `base_url` left as None are read by the SDK from ANTHROPIC_API_KEY and
    ANTHROPIC_BASE_URL. `http_timeout` is the SDK's own timeout: set it a little above the attempt
    limit of `TimeLimited`, so the limit that fires is ours and says so. `http_client` is the SDK's
    transport: "aiohttp" (its `DefaultAioHttpClient`, about half the CPU per call of its default) or
    "httpx". `sdk` replaces the client those would build: Bedrock's and Vertex's speak the same Messages
    API (bedrock.py, vertex.py).
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        http_timeout: float = 600.0,
        http_client: HttpClient = "aiohttp",
        clock: Clock = utcnow,
        sdk: AnthropicSdk | None = None,
    ) -> None:
        if sdk is None:
            if http_client not in HTTP_CLIENTS:
                raise ValueError(f"http_client must be one of {', '.join(HTTP_CLIENTS)}, got {http_client!r}")
            http = anthropic.DefaultAioHttpClient(timeout=http_timeout) if http_client == "aiohttp" else None
            sdk = anthropic.AsyncAnthropic(
                api_key=api_key, base_url=base_url, timeout=http_timeout, max_retries=0, http_client=http
            )
        self._sdk: AnthropicSdk = sdk
        self._clock = clock

    @property
    def base_url(self) -> str:
        return str(self._sdk.base_url)

    async def aclose(self) -> None:
        await self._sdk.close()

    async def send(self, request: LlmRequest) -> LlmResponse:
        params = request_params(request)
        try:
            if isinstance(self._sdk, anthropic.AsyncAnthropic):
                return await self._post(self._sdk, params, request.on_text)
            return await self._through_sdk(params, request.on_text)
        except anthropic.APIStatusError as e:
            headers = e.response.headers
            raise LlmError(
                e.status_code, retry_after(headers, self._clock()), _status_message(e), retryable=should_retry(headers)
            ) from e
        except anthropic.APIConnectionError as e:  # includes APITimeoutError
            cause = f" ({type(e.__cause__).__name__}: {e.__cause__})" if e.__cause__ is not None else ""
            raise LlmError(-1, None, truncated(f"{type(e).__name__}: {e.message}{cause}")) from e
        except httpx2.TransportError as e:  # a stream cut off midway surfaces as the SDK's httpx's own error
            raise LlmError(-1, None, truncated(f"stream interrupted: {type(e).__name__}: {e}")) from e

    async def _post(
        self, sdk: anthropic.AsyncAnthropic, params: dict[str, Any], on_text: Callable[[str], None] | None
    ) -> LlmResponse:
        """The request through the SDK's own `post` (headers, auth, base URL, timeout, status errors), the
        body as orjson bytes and the answer read here."""
        # The client's timeout given again, so that the SDK's x-stainless-timeout header names it.
        headers = JSON_HEADERS if "context_management" not in params else {
            **JSON_HEADERS, "anthropic-beta": ",".join(SERVER_CONTEXT_BETAS)}
        options: anthropic.RequestOptions = {"headers": headers, "timeout": sdk.timeout}
        try:
            body = orjson.dumps(params if on_text is None else {**params, "stream": True})
        except orjson.JSONEncodeError as e:  # the same request would fail the same way: not retried
            raise LlmError(400, None, truncated(f"the request cannot be sent as JSON: {e}")) from e
        if on_text is None:
            response = await sdk.post("/v1/messages", cast_to=httpx2.Response, content=body, options=options)
            return response_of(_json(response.content))
        response = await sdk.post(
            "/v1/messages", cast_to=httpx2.Response, content=body, options=options, stream=True
        )
        try:
            message = await read_stream(response, on_text)
        finally:
            await response.aclose()
        return response_of(message)

    async def _through_sdk(self, params: dict[str, Any], on_text: Callable[[str], None] | None) -> LlmResponse:
        """The request through the SDK's `messages` resource, for Bedrock's and Vertex's clients (its `beta`
        one when the provider manages the window)."""
        message: Any
        if "context_management" in params:
            beta: Any = self._sdk.beta.messages
            if on_text is None:
                message = await beta.create(**params, betas=list(SERVER_CONTEXT_BETAS))
            else:
                async with beta.stream(**params, betas=list(SERVER_CONTEXT_BETAS)) as stream:
                    async for text in stream.text_stream:
                        on_text(text)
                    message = await stream.get_final_message()
        elif on_text is None:
            message = await self._sdk.messages.create(**params)
        else:
            # The SDK's streaming interface: the same final message, with its text seen as it comes.
            async with self._sdk.messages.stream(**params) as stream:
                async for text in stream.text_stream:
                    on_text(text)
                message = await stream.get_final_message()
        # The message as the API sent it (minus nulls): by_alias + exclude_none keep the blocks ready to send back.
        return response_of(message.model_dump(mode="json", by_alias=True, exclude_none=True))


def request_params(request: LlmRequest) -> dict[str, Any]:
    """The Messages API body of `request`, with its cache breakpoints."""
    params: dict[str, Any] = {
        "model": request.model,
        "max_tokens": request.max_tokens,
        "messages": with_message_breakpoints(request.messages, request.stable_messages),
    }
    tools = [dict(t) for t in request.tools]
    if request.system:
        params["system"] = [{"type": "text", "text": request.system, "cache_control": EPHEMERAL}]
    elif tools:
        # No system prompt: the stable prefix ends with the tool definitions (they come first).
        tools[-1]["cache_control"] = EPHEMERAL
    if tools:
        params["tools"] = tools
    if (server := request.server_context) is not None:
        params["context_management"] = {"edits": [
            {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": server.trigger},
             "keep": {"type": "tool_uses", "value": max(server.keep_tool_uses, 1)}},
            {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": server.trigger}},
        ]}
    return params


def _json(data: bytes | str) -> Any:
    try:
        return exact_json(data)  # every number as the model wrote it: an integer past 64 bits is refused later
    except orjson.JSONDecodeError:
        text = data.decode(errors="replace") if isinstance(data, bytes) else data
        raise Unreadable(f"not JSON: {text}") from None


def response_of(message: Any) -> LlmResponse:
    """A Messages API message (a dict from JSON) as an `LlmResponse`; `Unreadable` if it is not one.

    Each block is kept as the API sent it, minus its null fields (as the SDK's models dump them with
    `exclude_none`), ready to send back.
    """
    if not isinstance(message, dict):
        raise Unreadable(f"a message must be a JSON object, got {type(message).__name__}")
    content = message.get("content")
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise Unreadable("content must be a list of blocks")
    stop_reason = message.get("stop_reason")
    usage = message.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    billed = _usage(usage)
    # The top-level counts are the model's own sampling; a server-side compaction's are in `iterations`
    # only, and are billed too. The window the model saw is the last `message` iteration's input.
    iterations = usage.get("iterations")
    iterations = [i for i in iterations if isinstance(i, dict)] if isinstance(iterations, list) else []
    for compaction in (i for i in iterations if i.get("type") == "compaction"):
        billed = _plus(billed, _usage(compaction))
    seen = next((_usage(i) for i in reversed(iterations) if i.get("type") == "message"), _usage(usage))
    managed = message.get("context_management")
    edits = managed.get("applied_edits") if isinstance(managed, dict) else None
    return LlmResponse(
        content=[{k: v for k, v in block.items() if v is not None} for block in content],
        stop_reason=stop_reason if isinstance(stop_reason, str) else None,
        id=_text_or_none(message.get("id")),
        model=_text_or_none(message.get("model")),
        usage=billed,
        context_tokens=seen.input_tokens + seen.cache_creation_input_tokens + seen.cache_read_input_tokens,
        applied_edits=tuple(e for e in edits if isinstance(e, dict)) if isinstance(edits, list) else (),
    )


def _usage(counts: dict[str, Any]) -> Usage:
    return Usage(
        input_tokens=_count(counts.get("input_tokens")),
        output_tokens=_count(counts.get("output_tokens")),
        cache_creation_input_tokens=_count(counts.get("cache_creation_input_tokens")),
        cache_read_input_tokens=_count(counts.get("cache_read_input_tokens")),
    )


def _plus(a: Usage, b: Usage) -> Usage:
    return Usage(a.input_tokens + b.input_tokens, a.output_tokens + b.output_tokens,
                 a.cache_creation_input_tokens + b.cache_creation_input_tokens,
                 a.cache_read_input_tokens + b.cache_read_input_tokens)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


async def read_stream(response: httpx2.Response, on_text: Callable[[str], None]) -> dict[str, Any]:
    """The final message of a Messages API event stream, `on_text` called with each text fragment.

    Blocks are built from `content_block_start` and their deltas: text appended, a tool call's
    `partial_json` joined and parsed at `content_block_stop`, thinking and its signature appended,
    citations added; `message_delta` brings the stop reason and the final usage counts. An `error`
    event raises `LlmError` with the status its type stands for, and a stream that ends before
    `message_stop` raises `Unreadable`: a truncated answer is not an answer.
    """
    message: dict[str, Any] | None = None
    stopped = False
    partial: dict[int, list[str]] = {}
    data: list[bytes] = []
    event = b""
    async for line in _lines(response):
        if line:
            if line.startswith(b"data:"):
                data.append(line[6:] if line.startswith(b"data: ") else line[5:])
            elif line.startswith(b"event:"):
                event = line[6:].strip()
            continue  # comments (":") and other fields are ignored, as in the SSE spec
        if not data:
            event = b""
            continue
        payload, data = b"\n".join(data), []
        kind, event = event.decode(errors="replace"), b""
        if kind == "ping":
            continue
        body = _json(payload)
        if not isinstance(body, dict):
            raise Unreadable(f"an event must be a JSON object: {payload.decode(errors='replace')}")
        kind = kind or str(body.get("type", ""))
        if kind == "error":
            raise _stream_error(body)
        if kind == "message_start":
            start = body.get("message")
            if not isinstance(start, dict):
                raise Unreadable("message_start without a message")
            message = {**start, "content": list(start.get("content") or [])}
            continue
        if message is None:
            raise Unreadable(f"{kind or 'an event'} before message_start")
        stopped = kind == "message_stop"
        _apply(message, partial, kind, body, on_text)
    if message is None or not stopped:
        raise Unreadable("the stream ended before message_stop")
    return message


async def _lines(response: httpx2.Response) -> AsyncIterator[bytes]:
    """The lines of a streamed body, as bytes without their ending (LF or CRLF): the events' JSON is parsed
    from bytes, never decoded to text first."""
    pending = b""
    async for chunk in response.aiter_bytes():
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line[:-1] if line.endswith(b"\r") else line
    if pending:
        yield pending


def _apply(
    message: dict[str, Any], partial: dict[int, list[str]], kind: str, body: dict[str, Any],
    on_text: Callable[[str], None],
) -> None:
    """One stream event applied to the message being built."""
    content: list[Any] = message["content"]
    if kind == "content_block_start":
        block = body.get("content_block")
        if not isinstance(block, dict):
            raise Unreadable("content_block_start without a content_block")
        content.append(dict(block))
        return
    if kind == "message_delta":
        delta = body.get("delta")
        if isinstance(delta, dict):
            message.update({k: v for k, v in delta.items() if k in ("stop_reason", "stop_sequence")})
        if isinstance(body.get("context_management"), dict):  # the context edits the API applied
            message["context_management"] = body["context_management"]
        usage = body.get("usage")
        if isinstance(usage, dict):  # the counts in a message_delta are cumulative: they replace
            message["usage"] = {**(message.get("usage") or {}), **{k: v for k, v in usage.items() if v is not None}}
        return
    if kind not in ("content_block_delta", "content_block_stop"):
        return  # message_stop, and event types this adapter does not know yet
    index = body.get("index")
    if not isinstance(index, int) or not 0 <= index < len(content):
        raise Unreadable(f"{kind} for a block never started: {index!r}")
    block = content[index]
    if kind == "content_block_stop":
        if index in partial:
            text = "".join(partial.pop(index))
            block["input"] = _json(text) if text else {}
        return
    delta = body.get("delta")
    if not isinstance(delta, dict):
        raise Unreadable("content_block_delta without a delta")
    match delta.get("type"):
        case "text_delta":
            text = str(delta.get("text", ""))
            block["text"] = block.get("text", "") + text
            on_text(text)
        case "input_json_delta":
            partial.setdefault(index, []).append(str(delta.get("partial_json", "")))
        case "thinking_delta":
            block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
        case "signature_delta":
            block["signature"] = block.get("signature", "") + str(delta.get("signature", ""))
        case "citations_delta":
            block["citations"] = [*(block.get("citations") or []), delta.get("citation")]
        case "compaction_delta":  # a server-side compaction's summary (and its opaque part), kept as sent
            for field in ("content", "encrypted_content"):
                if isinstance(delta.get(field), str):
                    block[field] = (block.get(field) or "") + delta[field]


def _stream_error(body: dict[str, Any]) -> LlmError:
    error = body.get("error")
    error = error if isinstance(error, dict) else {}
    kind = str(error.get("type", ""))
    message = str(error.get("message") or kind or "error event in the stream")
    return LlmError(STREAM_ERROR_STATUS.get(kind, 500), None, truncated(message))


def with_message_breakpoints(messages: list[Message], stable: int = 0) -> list[Message]:
    """The messages with cache breakpoints on the newest one and on the one the previous request ended with,
    and after the `stable` leading messages (a summary in place of older turns, which every later request
    sends unchanged: read from the cache while the turns after it come and go).

    The newest breakpoint writes the whole conversation to the cache, so the next iteration reads it
    back. The one two messages earlier is where the previous request wrote, so that entry is hit
    exactly even when the turn in between has more blocks than the cache's 20-block lookback. With
    the system prompt that is three breakpoints, within the API's four. The caller's dicts are not
    touched: marked messages and their last block are copies.
    """
    out = list(messages)
    for i in {len(out) - 1, len(out) - 3, stable - 1}:
        if i >= 0 and out[i].get("role") == "user":
            out[i] = _marked(out[i])
    return out


def _marked(message: Message) -> Message:
    content = message.get("content")
    blocks: list[Block] = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
    if not blocks:
        return message
    last = blocks[-1]
    if last.get("type") == "text" and not last.get("text"):
        return message  # the API refuses cache_control on an empty text block
    blocks[-1] = {**last, "cache_control": EPHEMERAL}
    return {**message, "content": blocks}


def should_retry(headers: Mapping[str, str]) -> bool | None:
    """The server's own verdict from `x-should-retry` ("true" or "false"), None without one.

    The Anthropic SDK obeys it before looking at the status, and so do we: it lets the API say that a
    500 will fail again, or that a 400 is a transient glitch.
    """
    value = headers.get("x-should-retry", "").strip().lower()
    return True if value == "true" else False if value == "false" else None


def retry_after(headers: Mapping[str, str], now: datetime.datetime) -> float | None:
    """Seconds to wait from `retry-after-ms` or `retry-after` (seconds or an HTTP date); None if absent or
    unreadable. Always within [0, MAX_RETRY_AFTER]: "inf", a year or a date far ahead is capped."""
    if (ms := _number(headers.get("retry-after-ms"))) is not None:
        return sane_retry_after(ms / 1000)
    value = headers.get("retry-after")
    if value is None:
        return None
    if (seconds := _number(value)) is not None:
        return sane_retry_after(seconds)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT
        when = when.replace(tzinfo=datetime.UTC)
    return sane_retry_after((when - now).total_seconds())


def _number(value: str | None) -> float | None:
    """`value` as a float (inf included), None if absent, not a number or NaN."""
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return None if math.isnan(number) else number


def _status_message(e: anthropic.APIStatusError) -> str:
    """The API's own `error.message` if the body has one, else the body as text."""
    if e.api_message:
        return truncated(str(e.api_message))
    return truncated(e.response.text or e.message)
