"""Model clients: the `LlmClient` seam, a scripted fake, and the Anthropic adapter with its decorators."""

from agentrun.worker.llm.types import LlmClient, LlmError, LlmRequest, LlmResponse, Usage

__all__ = ["LlmClient", "LlmError", "LlmRequest", "LlmResponse", "Usage"]
