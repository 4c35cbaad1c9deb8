"""What Bedrock and Vertex share: the Anthropic adapter on their SDK, and their credential errors as `LlmError`."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING

from agentrun.worker.core.types import LlmError, LlmRequest, LlmResponse
from agentrun.worker.llm.errors import ProviderUnavailable as ProviderUnavailable
from agentrun.worker.llm.errors import truncated

if TYPE_CHECKING:  # the SDK is imported by the provider that uses it, not by the router that names them
    from agentrun.worker.llm.anthropic_client import AnthropicClient

NOT_CONFIGURED = 400
"""The status of a provider that cannot be reached as configured (no region, no project, no SDK): like a
400 it fails the run at once with the reason, since the same request would fail the same way."""
NO_CREDENTIALS = 401
"""The status of a credential chain that yields nothing usable: not retried, the reason in the run."""


def require(module: str, provider: str, extra: str) -> None:
    """ProviderUnavailable unless `module` is installed."""
    if importlib.util.find_spec(module) is None:
        raise ProviderUnavailable(f"{provider} needs the {module} package: pip install 'agentrun[{extra}]'")


Classify = Callable[[Exception], LlmError | None]


class Credentialed:
    """An `LlmClient` decorator for a cloud SDK, whose credential chain runs inside the request: its
    errors, which are not the SDK's API errors, become `LlmError`s by `classify` (None: not ours, raised)."""

    def __init__(self, delegate: AnthropicClient, classify: Classify) -> None:
        self.delegate = delegate
        self.classify = classify

    async def aclose(self) -> None:
        await self.delegate.aclose()

    async def send(self, request: LlmRequest) -> LlmResponse:
        try:
            return await self.delegate.send(request)
        except LlmError:
            raise
        except Exception as e:
            error = self.classify(e)
            if error is None:
                raise
            raise error from e


def failure(status: int, provider: str, what: str, e: Exception) -> LlmError:
    return LlmError(status, None, truncated(f"{provider}: {what}: {type(e).__name__}: {e}"))
