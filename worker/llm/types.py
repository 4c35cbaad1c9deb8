"""The `LlmClient` seam: what the engine sends to a model and what it gets back, in Messages API shapes."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

# Messages API JSON (content blocks, messages, tool definitions) travels as plain dicts: it is stored
# verbatim in run_step and replayed verbatim, so the engine never needs to understand more of it than
# `type`, `id`, `name` and `input` of a tool_use block.
Block = dict[str, Any]
Message = dict[str, Any]

RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504, 529, -1})


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


@dataclasses.dataclass(frozen=True)
class LlmResponse:
    content: list[Block]
    stop_reason: str | None
    usage: Usage = Usage()
    id: str | None = None  # the provider's message id, for traces
    model: str | None = None  # the model that answered, as the provider names it


class LlmError(Exception):
    """A failed model call. `status` is the HTTP status, or -1 for connection errors and timeouts."""

    def __init__(self, status: int, retry_after: float | None = None, message: str = "") -> None:
        super().__init__(f"model error {status}: {message}" if message else f"model error {status}")
        self.status = status
        self.retry_after = retry_after  # seconds, from the retry-after header
        self.message = message

    @property
    def retryable(self) -> bool:
        return self.status in RETRYABLE_STATUSES


class LlmClient(Protocol):
    async def send(self, request: LlmRequest) -> LlmResponse: ...
