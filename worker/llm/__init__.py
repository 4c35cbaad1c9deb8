"""Model clients: the `LlmClient` seam, a scripted fake, one adapter per provider (Anthropic API, Bedrock,
Vertex, OpenAI-compatible), the router that picks one by the model's prefix, and the shared decorators."""

from agentrun.worker.core.types import LlmClient, LlmError, LlmRequest, LlmResponse, Usage

__all__ = ["LlmClient", "LlmError", "LlmRequest", "LlmResponse", "Usage"]
