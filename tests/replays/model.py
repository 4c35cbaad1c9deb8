"""The scripted model of the replay tests: a stateless planner that follows the plan written in the run's
input, so a recording and its replay (on another model) ask for the same calls, and a resumed run gets the
same answers. In process (`PlanLlm`) and over HTTP for worker processes (`PlanResponder`)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from agentrun.worker.core.types import LlmRequest, LlmResponse, Usage
from agentrun.worker.testing.fake_server import Reply, as_text, tool_results

RECORDED_MODEL = "claude-sonnet-4-5"
REPLAY_MODEL = "claude-haiku-4-5"

Call = tuple[str, dict[str, Any]]


def plan(*turns: list[Call] | Call, extra: dict[str, list[list[Call] | Call]] | None = None) -> str:
    """A run's input: its turns of tool calls (a call, or a list of calls made at once), and further turns a
    given model makes after them (`extra`: model -> turns)."""
    def turn(t: list[Call] | Call) -> list[Call]:
        return [t] if isinstance(t, tuple) else list(t)

    return json.dumps({"turns": [turn(t) for t in turns],
                       "extra": {m: [turn(t) for t in ts] for m, ts in (extra or {}).items()}})


def _text(content: Any) -> str:
    return content if isinstance(content, str) else as_text(content)


def answer(model: str, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """The content and stop reason of the next turn. The replay model writes each input's keys in the other
    order (a match must not depend on it); its final answer names the model, with every tool result in order."""
    planned = json.loads(_text(messages[0]["content"]))
    turns = planned["turns"] + planned["extra"].get(model, [])
    done = sum(1 for m in messages if m["role"] == "assistant")
    if done < len(turns):
        blocks = []
        for i, (name, args) in enumerate(turns[done]):
            if model == REPLAY_MODEL:
                args = dict(reversed(list(args.items())))
            blocks.append({"type": "tool_use", "id": f"toolu_{done}_{i}", "name": name, "input": args})
        return blocks, "tool_use"
    results = [r for m in messages if m["role"] == "user" for r in tool_results(m)]
    said = " | ".join(f"{'ERROR ' if r.get('is_error') else ''}{_text(r.get('content'))}" for r in results)
    return [{"type": "text", "text": f"{model}: {said}"}], "end_turn"


class PlanLlm:
    """`answer` as an LlmClient, in process."""

    def __init__(self) -> None:
        self.calls: list[str] = []  # the model of each request

    async def send(self, request: LlmRequest) -> LlmResponse:
        self.calls.append(request.model)
        content, stop = answer(request.model, [dict(m) for m in request.messages])
        return LlmResponse(content, stop, Usage(10, 5))


@dataclasses.dataclass
class PlanResponder:
    """`answer` over HTTP (FakeAnthropic). `hang`: (model, turn) whose request is answered only after an hour,
    for a test to kill the worker in the middle of it."""

    hang: tuple[str, int] | None = None

    def __call__(self, body: dict[str, Any]) -> Reply:
        messages = body.get("messages") or []
        content, stop = answer(body.get("model", ""), messages)
        reply = Reply.message(content, stop)
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if self.hang is not None and self.hang == (body.get("model"), turn):
            return reply.after(3600)
        return reply
