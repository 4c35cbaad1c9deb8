"""The `LlmClient` seam: what the engine sends to a model and what it gets back, in Messages API shapes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal, Protocol

# The failed model call and what it means for a retry live with the other errors the layers catch.
from agentrun.worker.core.errors import MAX_RETRY_AFTER as MAX_RETRY_AFTER
from agentrun.worker.core.errors import RETRYABLE_4XX as RETRYABLE_4XX
from agentrun.worker.core.errors import LlmError as LlmError
from agentrun.worker.core.errors import retryable_status as retryable_status
from agentrun.worker.core.errors import sane_retry_after as sane_retry_after

# Messages API JSON (content blocks, messages, tool definitions) travels as plain dicts: it is stored
# verbatim in run_step and replayed verbatim, so the engine never needs to understand more of it than
# `type`, `id`, `name` and `input` of a tool_use block.
Block = dict[str, Any]
Message = dict[str, Any]

HttpClient = Literal["aiohttp", "httpx"]
"""The Anthropic SDK's transports (AGENTRUN_LLM_HTTP_CLIENT); here, not in anthropic_client, so that a bad
setting is refused without importing the SDK."""
HTTP_CLIENTS: tuple[HttpClient, ...] = ("aiohttp", "httpx")

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
class ServerContext:
    """Ask the provider to keep the request within the window itself (contextManagement `server`): on the
    Messages API, its compaction beta past `trigger` input tokens, and its context editing, which clears old
    tool results keeping the newest `keep_tool_uses`."""

    trigger: int
    keep_tool_uses: int


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
    server_context: ServerContext | None = None
    """The provider manages the window (a client whose provider cannot ignores it: the engine asks only
    those that can, `supports_server_context`)."""
    stable_messages: int = 0
    """Leading messages that later requests send unchanged (a summary in place of older turns): a cache
    breakpoint after them keeps them read from the cache."""


@dataclasses.dataclass(frozen=True)
class LlmResponse:
    content: list[Block]
    stop_reason: str | None
    usage: Usage = Usage()
    id: str | None = None  # the provider's message id, for traces
    model: str | None = None  # the model that answered, as the provider names it
    context_tokens: int | None = None
    """The input the model saw, in the provider's count (after its own compaction or clearing), when known."""
    applied_edits: tuple[dict[str, Any], ...] = ()
    """The provider's context edits applied to this request (Messages API `context_management.applied_edits`)."""


class LlmClient(Protocol):
    async def send(self, request: LlmRequest) -> LlmResponse: ...
