"""The `LlmClient` seam: what the engine sends to a model and what it gets back, in Messages API shapes."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Literal, Protocol

# Messages API JSON (content blocks, messages, tool definitions) travels as plain dicts: it is stored
# verbatim in run_step and replayed verbatim, so the engine never needs to understand more of it than
# `type`, `id`, `name` and `input` of a tool_use block.
Block = dict[str, Any]
Message = dict[str, Any]

HttpClient = Literal["aiohttp", "httpx"]
"""The Anthropic SDK's transports (AGENTRUN_LLM_HTTP_CLIENT); here, not in anthropic_client, so that a bad
setting is refused without importing the SDK."""
HTTP_CLIENTS: tuple[HttpClient, ...] = ("aiohttp", "httpx")

RETRYABLE_4XX = frozenset({408, 409, 429})
"""The client errors worth another attempt, as the Anthropic SDK has them: a request timeout (408), a lock
timeout (409) and a rate limit (429). Every other 4xx (400, 401, 403, 404, 413, 422, ...) says the request
itself is wrong, so the same request would fail the same way: it is not retried."""

MAX_RETRY_AFTER = 60.0
"""Longest wait a `retry-after` can ask for, in seconds. The header is foreign input: a proxy may send an
absurd value ("inf", a year), and a wait that long would park a run and its lease. Past a minute the retry
policy's own backoff, and handing the run back when attempts are exhausted, serve better than obeying."""


def retryable_status(status: int) -> bool:
    """Whether a call that failed with `status` (-1: no HTTP answer at all) is worth another attempt.

    Connection errors and timeouts (-1), 408, 409, 429 and every 5xx (529 overloaded included) are; every
    other status is not.
    """
    return status == -1 or status in RETRYABLE_4XX or 500 <= status <= 599


def sane_retry_after(seconds: float | None) -> float | None:
    """`seconds` bounded to [0, MAX_RETRY_AFTER]; None for None or NaN (no usable hint)."""
    if seconds is None or math.isnan(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


@dataclasses.dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0

    @property
    def total(self) -> int:
        """Every billed token of the step: fresh input, cache writes, cache reads and output."""
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_creation_input_tokens
            + self.cache_read_input_tokens
        )


@dataclasses.dataclass(frozen=True)
class LlmRequest:
    model: str
    max_tokens: int
    messages: list[Message]
    system: str | None = None
    tools: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    on_text: Callable[[str], None] | None = dataclasses.field(default=None, compare=False, repr=False)
    """Called with each fragment of assistant text as it streams in, for live watchers only: a client that
    cannot stream may ignore it, and the response is the final message either way."""


@dataclasses.dataclass(frozen=True)
class LlmResponse:
    content: list[Block]
    stop_reason: str | None
    usage: Usage = Usage()
    id: str | None = None  # the provider's message id, for traces
    model: str | None = None  # the model that answered, as the provider names it


class LlmError(Exception):
    """A failed model call. `status` is the HTTP status, or -1 for connection errors and timeouts.

    `retryable` says whether the same request may succeed later: by default `retryable_status(status)`;
    an adapter passes the server's own verdict (Anthropic's `x-should-retry` header) when it has one. A
    caller that runs out of attempts on a retryable error can hand the work back for later instead of
    failing it. `retry_after` (seconds) is always within [0, MAX_RETRY_AFTER], or None.
    """

    def __init__(
        self, status: int, retry_after: float | None = None, message: str = "", *, retryable: bool | None = None
    ) -> None:
        super().__init__(f"model error {status}: {message}" if message else f"model error {status}")
        self.status = status
        self.retry_after = sane_retry_after(retry_after)
        self.message = message
        self.retryable = retryable_status(status) if retryable is None else retryable


class LlmClient(Protocol):
    async def send(self, request: LlmRequest) -> LlmResponse: ...
