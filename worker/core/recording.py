"""Replays (issue 47): a recorded run run again against a change, its tool calls answered from the recording.
Pure: what a replay asks for (`NewReplay`), the run each recorded run's replay is (`replay_spec`)."""

from __future__ import annotations

import dataclasses
import enum
import uuid
from collections.abc import Sequence
from typing import Any

from agentrun.worker.core.agents import parse_ref
from agentrun.worker.core.errors import Problem, Refusal, Refused
from agentrun.worker.core.records import Run
from agentrun.worker.core.submission import RunSpec


class ToolPolicy(str, enum.Enum):
    """How a replay run's tool calls are served (docs/api.md, "Tool calls in a replay")."""

    RECORDED = "recorded"  # from the recording; a call it has no match for gets an error result
    RECORDED_THEN_LIVE_READONLY = "recorded_then_live_readonly"  # ... or runs, if its tool only reads


@dataclasses.dataclass(frozen=True)
class Change:
    """What a replay changes of every recorded run; None leaves the recorded run's."""

    model: str | None = None
    system: str | None = None
    tools: tuple[str, ...] | None = None
    agent: str | None = None  # "name@version" (or "name": its latest); its fields replace the recorded run's


@dataclasses.dataclass(frozen=True)
class NewReplay:
    """A replay as its caller asks for it (runtime/door.py `Door.replay` makes it with its runs)."""

    id: uuid.UUID
    request: dict[str, Any]  # the POST body as normalised: stored as it is, reported back
    change: Change = Change()
    tool_policy: ToolPolicy = ToolPolicy.RECORDED
    scorer: str = "same_tool_calls"
    from_seq: int | None = None  # the replay runs keep the recorded steps before it, and diverge from there
    idempotency_key: str | None = None  # a retry with the same key (same tenant) gets the first replay


def conversation_start(run: Run, from_seq: int | None) -> int | None:
    """How many of `run`'s steps its replay keeps (it is a fork of `run` at that seq), or None: it starts
    afresh from the recorded run's input.

    With `from_seq`, the steps before it: a seq from 2 to the run's steps + 1 (from_seq 1 is a replay
    without it), else Refused (UNFIT) naming `fromSeq`. Without it, the replay starts where the recorded
    run started: a run that continued another starts with the conversation it inherited and its own next
    user message; a fork with the steps it took from its source; any other run (a sub-agent's run too)
    from its input. So the model is asked the same first question as the recorded run was, every time."""
    if from_seq is not None:
        if not 2 <= from_seq <= run.steps + 1:
            problem = (f"must be between 2 and {run.steps + 1} (run {run.id} has {run.steps} steps; "
                       "leave it out to replay from the start)")
            raise Refused(Refusal.UNFIT, f"fromSeq {problem}", [Problem("fromSeq", problem)])
        return from_seq - 1
    if run.parent_run_id is None or run.parent_tool_use_id is not None or run.inherited_steps == 0:
        return None
    if run.forked_at_seq is not None:
        return run.inherited_steps
    return min(run.inherited_steps + 1, run.steps)  # a continuation: its own user message is the next step


def replay_spec(replay: NewReplay, run: Run) -> RunSpec:
    """What the replay of `run` asks the door for: the recorded run as its source (its model, system, tools,
    budgets, output schema, labels, input... are inherited), the change applied, and forked where
    `conversation_start` says. Raises Refused: a fromSeq out of range, a malformed `change.agent`."""
    start = conversation_start(run, replay.from_seq)
    change = replay.change
    agent = parse_ref(change.agent, "change.agent") if change.agent is not None else None
    return RunSpec(model=change.model, system=change.system, tools=change.tools, agent=agent,
                   fork_from=(run.id, start) if start is not None else None)


_CHANGED = {"model": "change.model", "system": "change.system", "tools": "change.tools", "agent": "change.agent",
            "forkFrom.seq": "fromSeq"}


def refused_for(refused: Refused, index: int) -> Refused:
    """A refusal of the replay of `runs[index]`, its fields named as the replay's request names them:
    `change.*` for what the change gives, `runs[i].*` for what the recorded run does."""

    def named(field: str) -> str:
        for given, renamed in _CHANGED.items():
            if field == given or field.startswith((f"{given}[", f"{given}.")):
                return renamed + field[len(given):]
        return field if field.startswith(("change.", "fromSeq", "runs[")) else f"runs[{index}].{field}"

    problems = [dataclasses.replace(p, field=named(p.field)) for p in refused.problems]
    if not problems:
        return Refused(refused.kind, f"runs[{index}]: {refused.message}")
    message = "; ".join(f"{p.field}: {p.problem}" for p in problems)
    return Refused(refused.kind, message, problems)


def unfit_sources(recorded: Sequence[Run], tenant: str | None) -> None:
    """Refuse recorded runs a replay cannot be made of: another tenant's (NOT_FOUND, as if there were none),
    one still at work (CONFLICT: its recording is not finished), a run listed twice (INVALID)."""
    seen: set[uuid.UUID] = set()
    for i, run in enumerate(recorded):
        if tenant is not None and run.tenant != tenant:
            raise Refused(Refusal.NOT_FOUND, f"runs[{i}]: no run {run.id}", [Problem(f"runs[{i}]", f"no run {run.id}")])
        if not run.status.terminal:
            problem = f"run {run.id} is {run.status.value}; only a finished run can be replayed"
            raise Refused(Refusal.CONFLICT, f"runs[{i}]: {problem}", [Problem(f"runs[{i}]", problem)])
        if run.id in seen:
            raise Refused.of(Refusal.INVALID, [Problem(f"runs[{i}]", f"run {run.id} is listed twice")])
        seen.add(run.id)
    if not recorded:
        raise Refused.of(Refusal.INVALID, [Problem("runs", "names no run to replay")])
