"""Sub-agents as tools: the tool each pinned sub-agent is to the model, the child run a call of it asks
for, and what the child's end becomes for the parent's model. Pure.

A run that lists `subAgents` offers the model one tool per sub-agent, `agent__<name>`, taking
`{"task": string}`. A call starts a child run of that agent version (store/children.py makes it once per
call). The child's budgets are carved out of what the parent has left, split evenly between the
children of one turn, so the parent's budget bounds its whole tree; its deadline is at most the parent's.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import math
from decimal import ROUND_DOWN, Decimal
from typing import Any

import orjson

from agentrun.worker.core.records import Run, RunStatus

TOOL_PREFIX = "agent__"
MAX_DEPTH = 4
"""Sub-agent calls between a root run and its deepest descendant (AGENTRUN_MAX_AGENT_DEPTH)."""
MAX_CHILDREN_PER_TURN = 8
"""Sub-agent calls one model turn may start (AGENTRUN_MAX_CHILDREN_PER_TURN); later ones are errors."""
MAX_TASK = 100_000
"""Longest task text a call may give its child, in characters."""

TASK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"task": {"type": "string", "description": "What the sub-agent is to do, in full: it sees "
                                                              "nothing else of this conversation."}},
    "required": ["task"],
    "additionalProperties": False,
}


def tool_name(ref: str) -> str:
    """The tool a pinned sub-agent (`name@version`) is: `agent__name`."""
    return TOOL_PREFIX + ref.partition("@")[0]


def refs_by_tool(sub_agents: tuple[str, ...] | None) -> dict[str, tuple[str, int]]:
    """The run's sub-agent tools: tool name → (agent name, pinned version)."""
    found: dict[str, tuple[str, int]] = {}
    for ref in sub_agents or ():
        name, _, version = ref.partition("@")
        if version.isdigit():
            found.setdefault(TOOL_PREFIX + name, (name, int(version)))
    return found


def definition(name: str, version: int, description: str | None) -> dict[str, Any]:
    return {
        "name": TOOL_PREFIX + name,
        "description": (description or f"The agent {name}.")
        + " Runs as a sub-agent on its own and returns its answer; calls in one turn run in parallel.",
        "input_schema": TASK_SCHEMA,
    }


def task_of(args: Any) -> str:
    """The task of a call's input, or raises ValueError saying what is wrong with it (model output)."""
    if not isinstance(args, dict) or not isinstance(args.get("task"), str):
        raise ValueError('the input must be {"task": "<what the sub-agent is to do>"}')
    extra = sorted(set(args) - {"task"})
    if extra:
        raise ValueError(f"unexpected input fields: {', '.join(map(repr, extra[:5]))}; only task is taken")
    task: str = args["task"]
    if not task.strip():
        raise ValueError("task is empty")
    if len(task) > MAX_TASK:
        raise ValueError(f"task is {len(task)} characters long; at most {MAX_TASK}")
    return task


@dataclasses.dataclass(frozen=True)
class Share:
    """What one child of the turn may spend: its part of the parent's remainder."""

    token_budget: int
    cost_budget_usd: Decimal | None  # None: the parent has no cost budget
    timeout_seconds: int


def shares(parent: Run, tokens_used: int, cost_usd: Decimal, db_now: datetime.datetime, n: int) -> Share:
    """Each of `n` children's share of what the parent has left (its own spending and its finished
    descendants' counted), or ValueError saying what has run out."""
    tokens_left = parent.token_budget - tokens_used - parent.children_tokens
    token_share = tokens_left // max(n, 1)
    if token_share < 1:
        raise ValueError(f"no token budget left to start a sub-agent: {tokens_left} of {parent.token_budget} "
                         f"tokens left for {n} calls")
    cost_share = None
    if parent.cost_budget_usd is not None:
        cost_left = parent.cost_budget_usd - cost_usd - parent.children_cost
        cost_share = (cost_left / max(n, 1)).quantize(Decimal("0.000001"), rounding=ROUND_DOWN)
        if cost_share <= 0:
            raise ValueError(f"no cost budget left to start a sub-agent: ${max(cost_left, Decimal(0)):.4f} of "
                             f"${parent.cost_budget_usd:.4f} left")
    seconds_left = math.floor((parent.deadline_at - db_now).total_seconds())
    if seconds_left < 1:
        raise ValueError("no time left before the run's deadline to start a sub-agent")
    return Share(token_share, cost_share, seconds_left)


def lowered(value: int | None, share: int) -> int:
    return share if value is None else min(value, share)


def lowered_cost(value: Decimal | None, share: Decimal | None) -> Decimal | None:
    if share is None:
        return value
    return share if value is None else min(value, share)


def result_of(child: Run, agent: str) -> tuple[bool, str]:
    """What a finished child becomes for its parent's model: its answer (JSON text when structured), or
    an error naming its status and reason."""
    if child.status is RunStatus.SUCCEEDED:
        output = child.output
        if isinstance(output, str):
            return True, output
        return True, orjson.dumps(output).decode()  # a structured answer: the JSON value, as JSON text
    why = f": {child.error}" if child.error else ""
    return False, f"error: sub-agent {agent} (run {child.id}) ended {child.status.value}{why}"


def traceparent(parent: Run, tool_use_id: str) -> str:
    """The child's W3C traceparent: in its parent's trace (the caller's, or the one its run id names), under
    a span id the call names, so a resumed parent gives a child the same one."""
    trace_id = parent.traceparent.split("-")[1] if parent.traceparent else f"{parent.id.int:032x}"
    span_id = hashlib.sha256(f"{parent.id}/{tool_use_id}".encode()).hexdigest()[:16]
    return f"00-{trace_id}-{span_id}-01"
