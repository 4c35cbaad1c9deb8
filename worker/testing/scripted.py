"""A scripted `LlmClient` for tests and benchmarks: it answers from a queue and records what it was sent."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from agentrun.worker.core.types import LlmError, LlmRequest, LlmResponse, Usage


class ScriptedLlm:
    """Plays back canned responses in order; each `then_*` call appends one."""

    def __init__(self) -> None:
        self._script: collections.deque[LlmResponse | LlmError] = collections.deque()
        self.seen: list[LlmRequest] = []

    def then_tool_use(
        self, id: str, name: str, input: dict[str, Any] | None = None, in_: int = 0, out: int = 0
    ) -> ScriptedLlm:
        return self.then_tool_uses([(id, name, input or {})], in_, out)

    def then_tool_uses(self, uses: list[tuple[str, str, dict[str, Any]]], in_: int = 0, out: int = 0) -> ScriptedLlm:
        """One turn asking for several tools at once (parallel tool use)."""
        blocks = [{"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in uses]
        self._script.append(LlmResponse(blocks, "tool_use", Usage(in_, out)))
        return self

    def then_text(self, text: str, in_: int = 0, out: int = 0) -> ScriptedLlm:
        self._script.append(LlmResponse([{"type": "text", "text": text}], "end_turn", Usage(in_, out)))
        return self

    def then_response(self, response: LlmResponse) -> ScriptedLlm:
        self._script.append(response)
        return self

    def then_fail(self, error: LlmError) -> ScriptedLlm:
        self._script.append(error)
        return self

    @property
    def remaining(self) -> int:
        return len(self._script)

    async def send(self, request: LlmRequest) -> LlmResponse:
        self.seen.append(request)
        await asyncio.sleep(0)  # a real client yields to the event loop; so does this one
        if not self._script:
            raise LlmError(400, None, "scripted model has no more responses")
        item = self._script.popleft()
        if isinstance(item, LlmError):
            raise item
        return item


class TurnBasedLlm:
    """A stateless scripted model for many concurrent runs: it asks for `turns` tool turns, then answers.

    What it answers depends only on the request (how many assistant turns the conversation already
    has), so any number of runs can share one instance and a resumed run gets the same answers.
    `tools_per_turn` above one asks for several tools in one turn (parallel tool use).
    """

    def __init__(
        self, turns: int, tool: str = "noop", tools_per_turn: int = 1, in_: int = 10, out: int = 5
    ) -> None:
        self.turns, self.tool, self.tools_per_turn = turns, tool, tools_per_turn
        self.usage = Usage(in_, out)
        self.calls = 0

    async def send(self, request: LlmRequest) -> LlmResponse:
        self.calls += 1
        done = sum(1 for m in request.messages if m["role"] == "assistant")
        if done >= self.turns:
            return LlmResponse([{"type": "text", "text": f"done after {done} turns"}], "end_turn", self.usage)
        blocks = [
            {"type": "tool_use", "id": f"toolu_{done}_{i}", "name": self.tool, "input": {"turn": done, "i": i}}
            for i in range(self.tools_per_turn)
        ]
        return LlmResponse(blocks, "tool_use", self.usage)


class TreeLlm:
    """A stateless scripted model for runs with sub-agents, shared by every run of a tree.

    A run offered `agent__*` tools calls each of them once, all in its first turn (parallel sub-agent
    calls), each with a task naming its part of the run's input; given their results, it answers with
    them joined. A run offered none answers `<system>: <task>` at once. With `hold`, a run without
    sub-agents waits for it before answering (a child at work, for as long as a test needs).
    """

    def __init__(self, in_: int = 10, out: int = 5, hold: asyncio.Event | None = None) -> None:
        self.usage = Usage(in_, out)
        self.hold = hold
        self.seen: list[LlmRequest] = []

    async def send(self, request: LlmRequest) -> LlmResponse:
        self.seen.append(request)
        await asyncio.sleep(0)
        agents = [t["name"] for t in request.tools if str(t.get("name", "")).startswith("agent__")]
        first = request.messages[0]["content"] if request.messages else ""
        task = first if isinstance(first, str) else " ".join(str(b.get("text", "")) for b in first)
        results = [b for m in request.messages if m["role"] == "user" and isinstance(m["content"], list)
                   for b in m["content"] if b.get("type") == "tool_result"]
        if agents and not results:
            blocks = [{"type": "tool_use", "id": f"toolu_{i}_{name}", "name": name,
                       "input": {"task": f"part {i + 1} of: {task}"}} for i, name in enumerate(agents)]
            return LlmResponse(blocks, "tool_use", self.usage)
        if agents:
            joined = " | ".join(f"{'ERROR ' if r.get('is_error') else ''}{_text(r.get('content'))}" for r in results)
            return LlmResponse([{"type": "text", "text": f"combined: {joined}"}], "end_turn", self.usage)
        if self.hold is not None:
            await self.hold.wait()
        return LlmResponse([{"type": "text", "text": f"{request.system or 'agent'}: {task}"}], "end_turn", self.usage)


def _text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return str(content)
