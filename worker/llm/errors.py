"""The model adapters' own errors, and how a foreign error body is cut before it reaches a run or a log.

A failed call is a `core.errors.LlmError` (the engine catches it); what is here stays inside the adapters
and the factory that builds them.
"""

from __future__ import annotations

from agentrun.worker.core.errors import LlmError

__all__ = ["MAX_ERROR_CHARS", "ProviderUnavailable", "Unreadable"]

MAX_ERROR_CHARS = 500
"""Foreign error bodies (an HTML page from a proxy, say) are cut to this length before they reach a run's
`error` column or a log line."""


def truncated(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class ProviderUnavailable(Exception):
    """A provider cannot be built from the environment; the message says what to set or install."""


class Unreadable(LlmError):
    """A success status whose body is not a Messages API message (a proxy's page, a cut or garbled body):
    worth another attempt, like a 5xx."""

    def __init__(self, what: str) -> None:
        super().__init__(-1, None, truncated(f"unreadable answer: {what}"))
