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
import json
from typing import Any, Literal, cast

import orjson

from agentrun.worker.core.errors import DoesNotFit as DoesNotFit

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


SUMMARY_SYSTEM = (
    "You condense the work so far of an AI agent into a summary the agent will continue from, in place of "
    "the turns summarised. Keep everything the rest of the task needs: the task itself as first given, "
    "decisions made, facts and figures found, identifiers (files, records, tool call ids), what was tried "
    "and failed, and what remains to do. Leave out what no later step needs. Write plain text, no preamble."
)
SUMMARY_ASK = "Summarise the conversation above as instructed, for the agent to continue from."
SUMMARY_HEADER = ("[The conversation before this point was summarised to keep it within the model's context "
                  "window; every original step is kept in the run's step log. Summary:]")
SUMMARY_MAX_TOKENS = 4096
CHARS_PER_TOKEN = 3
"""The estimate of tokens in text the provider has not counted yet: a character count over 3, which
overestimates English prose and JSON (about 4 characters a token) on purpose."""


def estimate_tokens(value: Any) -> int:
    """Tokens `value` (messages, blocks, tool definitions) will take, estimated from its JSON's length."""
    try:
        size = len(orjson.dumps(value))
    except TypeError:  # an integer past 64 bits in a model's turn (refused later, but estimated first)
        size = len(json.dumps(value, default=str))
    return -(-size // CHARS_PER_TOKEN)


def summary_message(summary: str) -> dict[str, Any]:
    """The user message replay sends in place of the turns a summary covers."""
    return {"role": "user", "content": [{"type": "text", "text": f"{SUMMARY_HEADER}\n\n{summary}"}]}


def cleared(tool: str, seq: int) -> str:
    """What a cleared tool result reads as: which tool, and the step that keeps the full result."""
    return f"[result of {tool} cleared; kept in step {seq}]"  # short: a long run keeps one per old call


def transcript(messages: list[dict[str, Any]], max_chars: int | None = None) -> str:
    """The messages as text for a summarising call, which needs no tools: every block labelled, tool calls
    and results with their ids. Longer than `max_chars`, each block is cut to an equal share of it."""
    parts: list[tuple[str, str]] = []
    for message in messages:
        who = "User" if message.get("role") == "user" else "Assistant"
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        for block in blocks:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text":
                parts.append((f"{who}:", str(block.get("text", ""))))
            elif kind == "tool_use":
                parts.append((f"{who} called tool {block.get('name')} (id {block.get('id')}) with:",
                               json.dumps(block.get("input"), ensure_ascii=False, default=str)))
            elif kind == "tool_result":
                error = " (an error)" if block.get("is_error") else ""
                parts.append((f"Result{error} of tool call {block.get('tool_use_id')}:", _text(block.get("content"))))
            elif kind == "compaction" and isinstance(block.get("content"), str):
                parts.append(("Earlier summary:", block["content"]))
    if max_chars is not None and parts and sum(len(h) + len(t) + 2 for h, t in parts) > max_chars:
        share = max(max_chars // len(parts) - 80, 40)
        parts = [(h, t if len(t) <= share else t[:share] + " …[cut]") for h, t in parts]
    return "\n\n".join(f"{h}\n{t}" for h, t in parts)


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(str(b.get("text", "")) if b.get("type") == "text" else f"[{b.get('type')} block]"
                         for b in content if isinstance(b, dict))
    return str(content or "")
