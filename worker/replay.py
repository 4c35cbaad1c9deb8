"""Replay: the conversation rebuilt from a run's input and its ordered steps. Pure, no I/O.

The step log is the single source of truth. A worker replays it in full when it claims a run and then
applies each step it writes, so continuing and resuming are the same code path and a long run costs
the same per step at step 500 as at step 5.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from agentrun.worker.answer import FINAL_ANSWER
from agentrun.worker.llm.types import Block, Message
from agentrun.worker.records import Step, StepKind, StepStatus

CORRECTION = "correction"
"""The `request` of a USER step the engine wrote to correct a structured answer (not a person's input)."""


class Conversation:
    """Messages for the next model call, the tool calls still owed, and whether the run is finished."""

    def __init__(self, input: str) -> None:
        self.messages: list[Message] = [{"role": "user", "content": input}]
        self.pending: dict[str, Block] = {}  # tool_use id → block, in the order the model asked
        self.started: set[str] = set()  # pending tool_use ids with a STARTED row: executed before, outcome unknown
        self._results: list[Block] = []  # tool_result blocks of the current turn, not yet flushed
        self.last_stop: str | None = None
        self.steps = 0  # the highest seq applied
        self.model_steps = 0
        self.rejected_answers = 0  # structured answers refused (a final_answer that did not validate, or none)

    @classmethod
    def replay(cls, input: str, steps: Iterable[Step]) -> Conversation:
        """The run's conversation. One continued from another begins with a USER step (its parent's
        opening message, inherited), and then `input` is a USER step of its own, further on."""
        c = cls(input)
        for i, s in enumerate(steps):
            if i == 0 and s.kind is StepKind.USER:
                c.messages = []
            c.apply(s)
        return c

    @property
    def finished(self) -> bool:
        """The model stopped for a reason other than asking for tools, and nothing is owed."""
        return self.last_stop is not None and self.last_stop != "tool_use" and not self.pending

    @property
    def final_text(self) -> str:
        """The text blocks of the newest assistant message, joined: a finished run's answer."""
        for message in reversed(self.messages):
            if message["role"] == "assistant":
                content = message["content"]
                if isinstance(content, str):
                    return content
                return "".join(
                    str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text"
                )
        return ""

    @property
    def next_tool_use(self) -> Block | None:
        return next(iter(self.pending.values()), None)

    def apply(self, step: Step) -> None:
        self.steps = max(self.steps, step.seq)
        if step.kind is StepKind.USER:
            if step.request == CORRECTION:
                self.rejected_answers += 1
            self._flush()
            self.messages.append({"role": "user", "content": step.response or ""})
            self.last_stop = None
            self.pending = {}
            self.started.clear()
        elif step.kind is StepKind.MODEL:
            self._flush()
            content: list[Block] = orjson.loads(step.response or "[]")
            self.messages.append({"role": "assistant", "content": content})
            self.model_steps += 1
            self.last_stop = step.stop_reason
            self.pending = {b["id"]: b for b in content if b.get("type") == "tool_use"}
            self.started.clear()
        elif step.status is StepStatus.STARTED:
            if step.tool_use_id in self.pending:
                self.started.add(step.tool_use_id)
        elif step.tool_use_id in self.pending:
            del self.pending[step.tool_use_id]
            self.started.discard(step.tool_use_id)
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": step.tool_use_id,
                "content": step.response or "",
            }
            if step.status is StepStatus.ERROR:
                result["is_error"] = True
                if step.tool_name == FINAL_ANSWER:
                    self.rejected_answers += 1
            self._results.append(result)
            if not self.pending:
                self._flush()

    def _flush(self) -> None:
        """All tool_result blocks of one turn go into ONE user message, as the API requires."""
        if self._results:
            self.messages.append({"role": "user", "content": self._results})
            self._results = []
