"""Builds the model client a worker uses from its settings and the environment."""

from __future__ import annotations

from typing import Any

from agentrun.worker.llm.types import LlmClient


def llm_from_env(settings: Any) -> LlmClient:
    """Retrying(TimeLimited(Anthropic)) configured from ANTHROPIC_* variables (its own issue)."""
    raise SystemExit("agentrun: the Anthropic model client is not built yet")
