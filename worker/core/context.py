"""Context-window management: how a run's conversation is kept within its model's window. Pure, no I/O.

A run (or an agent definition, for its runs) says `contextManagement: {"strategy", "triggerTokens"?,
"keepRecentTurns"?}`:

- `server`: the provider compacts (the Messages API's compaction and context-editing betas); the blocks it
  returns are stored in the step log as they came and sent back by replay.
- `summarize`: before a request would pass `triggerTokens`, the engine makes a summarising model call, a
  COMPACT step of its own; replay sends the summary in place of the turns it covers.
- `clear_tool_results`: old tool results are replaced by a placeholder naming the tool and the step that
  keeps the full result (a COMPACT step without a model call).
- `auto` (the default): `server` where the provider supports it, else `summarize`.
- `none`: nothing is done; a request that cannot fit fails the run before it is sent.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, cast

Strategy = Literal["auto", "server", "summarize", "clear_tool_results", "none"]
STRATEGIES: tuple[Strategy, ...] = ("auto", "server", "summarize", "clear_tool_results", "none")
DEFAULT_KEEP_RECENT_TURNS = 2
TRIGGER_SHARE = 0.8
"""`triggerTokens` by default: this share of the model's window."""
MAX_KEEP_RECENT_TURNS = 1000
MAX_TRIGGER_TOKENS = 100_000_000


@dataclasses.dataclass(frozen=True)
class ContextPolicy:
    strategy: Strategy = "auto"
    trigger_tokens: int | None = None
    """Manage the conversation once a request would pass this many input tokens; None: 80% of the window."""
    keep_recent_turns: int = DEFAULT_KEEP_RECENT_TURNS
    """Turns (an assistant message and the user message after it) never summarised or cleared."""

    def to_json(self) -> dict[str, Any]:
        """The policy as the API shows it and the database stores it (camelCase, every field)."""
        out: dict[str, Any] = {"strategy": self.strategy, "keepRecentTurns": self.keep_recent_turns}
        if self.trigger_tokens is not None:
            out["triggerTokens"] = self.trigger_tokens
        return out

    @classmethod
    def of(cls, stored: dict[str, Any] | None) -> ContextPolicy:
        """The policy a run's stored `context_management` names (None: the default). Stored values were
        checked by `parse` when they were written; anything unreadable is the default, never a crash."""
        if not stored:
            return DEFAULT
        try:
            return parse(stored)
        except ValueError:
            return DEFAULT

    def trigger(self, window: int) -> int:
        """Input tokens past which a request of a model with `window` tokens is managed."""
        if self.trigger_tokens is not None:
            return self.trigger_tokens
        return int(window * TRIGGER_SHARE)


DEFAULT = ContextPolicy()


def parse(value: Any, field: str = "contextManagement") -> ContextPolicy:
    """A `contextManagement` object from a request, a spec or a stored row; ValueError naming the field."""
    if not isinstance(value, dict):
        raise ValueError(f"{field} must be an object like {{\"strategy\": \"auto\"}}, got {type(value).__name__}")
    unknown = sorted(set(value) - {"strategy", "triggerTokens", "keepRecentTurns"})
    if unknown:
        raise ValueError(f"{field} has unknown field(s) {', '.join(unknown)}: it takes strategy, triggerTokens "
                         "and keepRecentTurns")
    strategy = value.get("strategy", "auto")
    if strategy not in STRATEGIES:
        raise ValueError(f"{field}.strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    trigger = value.get("triggerTokens")
    if trigger is not None and not _count(trigger, 1, MAX_TRIGGER_TOKENS):
        raise ValueError(f"{field}.triggerTokens must be an integer from 1 to {MAX_TRIGGER_TOKENS}, got {trigger!r}")
    keep = value.get("keepRecentTurns", DEFAULT_KEEP_RECENT_TURNS)
    if not _count(keep, 0, MAX_KEEP_RECENT_TURNS):
        raise ValueError(f"{field}.keepRecentTurns must be an integer from 0 to {MAX_KEEP_RECENT_TURNS}, "
                         f"got {keep!r}")
    return ContextPolicy(cast(Strategy, strategy), trigger, keep)


def _count(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
