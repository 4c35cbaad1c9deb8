"""Replays (issue 47): a recorded run run again against a change, its tool calls answered from the recording.
Pure: what a replay asks for (`NewReplay`), the run each recorded run's replay is (`replay_spec`), and which
recorded result a call of a replay run gets (`Recording`), or why it gets none (`blocked_because`)."""

from __future__ import annotations

import collections
import dataclasses
import enum
import json
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from agentrun.worker.core.agents import parse_ref
from agentrun.worker.core.errors import Problem, Refusal, Refused
from agentrun.worker.core.records import Run, Step, StepKind, StepStatus
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


# -- tool calls in a replay (docs/api.md "Tool calls in a replay") -----------------------------------

NOT_RECORDED = "not in the recording"
"""What every error result of a call a replay blocked says (the words a test or a scorer can look for)."""

Key = tuple[str, str]
"""A call as matching sees it: the tool's name and its canonical input."""


def canonical(value: Any) -> str:
    """A call's input as matching compares it: the JSON value with its object keys sorted, written without
    insignificant whitespace. Strings (keys and values) compare exactly, character for character; arrays
    keep their order; numbers compare as JSON parsing gives them (an integer never equals a fraction: 1 is
    not 1.0; 1e2 is 100.0)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def key_of(name: str, tool_input: Any) -> Key:
    return name, canonical(tool_input)


def step_key(step: Step) -> Key:
    """The key of a TOOL step, from the input it stored as JSON text (a text that is not JSON is its own key)."""
    try:
        value = json.loads(step.request) if step.request is not None else None
    except ValueError:
        return step.tool_name or "", step.request or ""
    return key_of(step.tool_name or "", value)


class Recording:
    """The results a replay run may be served, and what it took of them.

    The k-th call of the replay with a key gets the recorded result of the k-th recorded call with that key:
    the recorded run's finished TOOL steps after the replay's starting point (`after_seq`: its fork's seq, 0
    for a fresh start), in seq order, against the replay run's own TOOL steps after that point, finished,
    whatever they got (served, blocked or run live). Both come from the step log, so a worker that resumes
    the replay after a crash counts what the first one served and serves the rest the same."""

    def __init__(self, recorded: Sequence[Step], replayed: Sequence[Step], skip: Callable[[str], bool]) -> None:
        self._calls: dict[Key, list[Step]] = {}
        for step in recorded:
            if step.kind is StepKind.TOOL and step.status is not StepStatus.STARTED and not skip(step.tool_name or ""):
                self._calls.setdefault(step_key(step), []).append(step)
        self._made: collections.Counter[Key] = collections.Counter(
            step_key(s) for s in replayed
            if s.kind is StepKind.TOOL and s.status is not StepStatus.STARTED and not skip(s.tool_name or ""))

    def take(self, name: str, tool_input: Any) -> Step | None:
        """The recorded step whose result the next call (`name`, `tool_input`) gets, or None; the call is
        counted either way (it is answered: served, blocked, or run live)."""
        key = key_of(name, tool_input)
        k = self._made[key]
        self._made[key] += 1
        calls = self._calls.get(key, [])
        return calls[k] if k < len(calls) else None


@dataclasses.dataclass(frozen=True)
class Abilities:
    """What a replay needs to know of a tool to run a call of it live."""

    known: bool  # one of the worker's tools (not a sub-agent, not a built-in wait)
    read_only: bool
    idempotent: bool
    destructive: bool
    needs_approval: bool


def blocked_because(policy: ToolPolicy, name: str, tool: Abilities) -> str | None:
    """Why a call the recording has no result for is not run live (the error result it gets), or None: it
    runs. Under `recorded` none runs; under `recorded_then_live_readonly` a call of a read-only, idempotent,
    not destructive tool that needs no approval does. A sub-agent's call or a wait never does: a replay
    starts no child and waits for nothing the recording does not answer."""
    if tool.needs_approval:
        return (f"error: {NOT_RECORDED}: this call of {name} needs a person's approval, and the approval is not "
                "in the recording (a replay never asks anyone)")
    if policy is ToolPolicy.RECORDED:
        return (f"error: {NOT_RECORDED}: the recorded run made no such call of {name} with this input (or not this "
                "many times); under the tool policy `recorded` a replay runs no tool")
    if not tool.known:
        return (f"error: {NOT_RECORDED}: {name} is not a tool a replay may run live (a sub-agent, a wait, or a "
                "tool this worker does not have)")
    if not tool.read_only or not tool.idempotent or tool.destructive:
        why = ("it is destructive" if tool.destructive else "it is not idempotent" if not tool.idempotent
               else "it is not read-only")
        return (f"error: {NOT_RECORDED}: the recorded run made no such call of {name} with this input, and {why}: "
                "a replay never runs it")
    return None
