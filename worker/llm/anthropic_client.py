"""The Anthropic adapter: an `LlmClient` on the official SDK's `AsyncAnthropic`, with prompt-cache breakpoints.

Retrying and the per-attempt time limit are decorators around it (retry.py, timeout.py): the SDK's own
retries are off, so exactly one HTTP request is made per `send`.
"""

from __future__ import annotations

import datetime
import email.utils
import math
from collections.abc import Callable, Mapping
from typing import Any

import anthropic
import httpx

from agentrun.worker.llm.types import Block, LlmError, LlmRequest, LlmResponse, Message, Usage, sane_retry_after

EPHEMERAL: dict[str, str] = {"type": "ephemeral"}
MAX_ERROR_CHARS = 500
"""Foreign error bodies (an HTML page from a proxy, say) are cut to this length before they reach a run's
`error` column or a log line."""

Clock = Callable[[], datetime.datetime]
AnthropicSdk = anthropic.AsyncAnthropic | anthropic.AsyncAnthropicBedrock | anthropic.AsyncAnthropicVertex


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class AnthropicClient:
    """One Messages API call per `send`; SDK errors become `LlmError`. A request with `on_text` is streamed.

    `api_key` and `base_url` left as None are read by the SDK from ANTHROPIC_API_KEY and
    ANTHROPIC_BASE_URL. `http_timeout` is the SDK's own timeout: set it a little above the attempt
    limit of `TimeLimited`, so the limit that fires is ours and says so. `sdk` replaces the client
    those three would build: Bedrock's and Vertex's speak the same Messages API (bedrock.py, vertex.py).
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        http_timeout: float = 600.0,
        clock: Clock = _utcnow,
        sdk: AnthropicSdk | None = None,
    ) -> None:
        self._sdk: AnthropicSdk = sdk or anthropic.AsyncAnthropic(
            api_key=api_key, base_url=base_url, timeout=http_timeout, max_retries=0
        )
        self._clock = clock

    @property
    def base_url(self) -> str:
        return str(self._sdk.base_url)

    async def aclose(self) -> None:
        await self._sdk.close()

    async def send(self, request: LlmRequest) -> LlmResponse:
        params: dict[str, Any] = {
            "model": request.model,
            "max_tokens": request.max_tokens,
            "messages": with_message_breakpoints(request.messages),
        }
        tools = [dict(t) for t in request.tools]
        if request.system:
            params["system"] = [{"type": "text", "text": request.system, "cache_control": EPHEMERAL}]
        elif tools:
            # No system prompt: the stable prefix ends with the tool definitions (they come first).
            tools[-1]["cache_control"] = EPHEMERAL
        if tools:
            params["tools"] = tools
        try:
            if request.on_text is None:
                message = await self._sdk.messages.create(**params)
            else:
                # The SDK's streaming interface: the same final message, with its text seen as it comes.
                async with self._sdk.messages.stream(**params) as stream:
                    async for text in stream.text_stream:
                        request.on_text(text)
                    message = await stream.get_final_message()
        except anthropic.APIStatusError as e:
            headers = e.response.headers
            raise LlmError(
                e.status_code, retry_after(headers, self._clock()), _status_message(e), retryable=should_retry(headers)
            ) from e
        except anthropic.APIConnectionError as e:  # includes APITimeoutError
            cause = f" ({type(e.__cause__).__name__}: {e.__cause__})" if e.__cause__ is not None else ""
            raise LlmError(-1, None, _truncate(f"{type(e).__name__}: {e.message}{cause}")) from e
        except httpx.TransportError as e:  # a stream cut off midway surfaces as httpx's own error
            raise LlmError(-1, None, _truncate(f"stream interrupted: {type(e).__name__}: {e}")) from e
        usage = message.usage
        return LlmResponse(
            # by_alias + exclude_none: the blocks as the API sent them (minus nulls), ready to send back.
            content=[block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in message.content],
            stop_reason=message.stop_reason,
            id=message.id,
            model=message.model,
            usage=Usage(
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                cache_creation_input_tokens=usage.cache_creation_input_tokens or 0,
                cache_read_input_tokens=usage.cache_read_input_tokens or 0,
            ),
        )


def with_message_breakpoints(messages: list[Message]) -> list[Message]:
    """The messages with cache breakpoints on the newest one and on the one the previous request ended with.

    The newest breakpoint writes the whole conversation to the cache, so the next iteration reads it
    back. The one two messages earlier is where the previous request wrote, so that entry is hit
    exactly even when the turn in between has more blocks than the cache's 20-block lookback. With
    the system prompt that is three breakpoints, within the API's four. The caller's dicts are not
    touched: marked messages and their last block are copies.
    """
    out = list(messages)
    for i in {len(out) - 1, len(out) - 3}:
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
        return _truncate(str(e.api_message))
    return _truncate(e.response.text or e.message)


def _truncate(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
