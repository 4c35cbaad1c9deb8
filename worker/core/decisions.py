"""What to do next with the tool calls a run still owes, given the decisions people made. Pure, no I/O.

A call runs unless it needs a person: a call of a tool that requires approval waits for `approve` (runs)
or `deny` (the model is told); a non-idempotent call found STARTED after a crash is in doubt and waits
for `retry` (runs again, same key), `record` (what it returned, without running it) or `fail`. Calls
that need nobody run first; when only waiting ones are left, the run parks WAITING.

A decision is asked, and taken, at an attempt: the executions of the call already started then (0 for
an approval). It authorises the next execution only: a call whose retried (or approved) execution was
interrupted too is found STARTED with one attempt more, and is in doubt again until someone decides
at that attempt. An idempotent call runs again whatever its attempts (its key makes that safe).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentrun.worker.core.records import Decision, DecisionKind, PendingCall

Block = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Execute:
    use: Block


@dataclasses.dataclass(frozen=True)
class Settle:
    """Record the call's result without executing it."""

    use: Block
    ok: bool
    output: str


@dataclasses.dataclass(frozen=True)
class Park:
    calls: Sequence[tuple[Block, DecisionKind, int]]  # (call, what it waits for, the attempt it is asked at)


@dataclasses.dataclass(frozen=True)
class Fail:
    reason: str


Next = Execute | Settle | Park | Fail


Key = tuple[str, DecisionKind, int]
"""A decision's key: (tool_use id, kind, attempt)."""


def key_of(call: PendingCall) -> Key:
    return call.tool_use_id, call.kind, call.attempt


def next_call(
    pending: Sequence[Block],
    started: Mapping[str, int],
    *,
    in_doubt_if_started: Callable[[str], bool],
    needs_approval: Callable[[str], bool],
    decisions: Mapping[Key, PendingCall],
) -> Next | None:
    """The next thing to do about `pending` (the calls owed, in the model's order), or None if none is owed.

    `started` maps the owed calls with a STARTED row to their attempts (executions started so far)."""
    waiting: list[tuple[Block, DecisionKind, int]] = []
    for use in pending:
        tool_use_id, name = use["id"], use["name"]
        if tool_use_id in started and in_doubt_if_started(name):
            attempt = started[tool_use_id]
            decided = decisions.get((tool_use_id, DecisionKind.IN_DOUBT, attempt))
            if decided is None or decided.decision is None:
                waiting.append((use, DecisionKind.IN_DOUBT, attempt))
                continue
            if decided.decision is Decision.RECORD:
                return Settle(use, ok=not decided.is_error, output=decided.output or "")
            if decided.decision is Decision.FAIL:
                why = f": {decided.reason}" if decided.reason else ""
                return Fail(
                    f"tool {name} (tool_use id {tool_use_id}) was in doubt after its worker died, and a person "
                    f"chose to fail the run{why}"
                )
            return Execute(use)  # retry
        if needs_approval(name):
            decided = decisions.get((tool_use_id, DecisionKind.APPROVAL, 0))
            if decided is None or decided.decision is None:
                waiting.append((use, DecisionKind.APPROVAL, 0))
                continue
            if decided.decision is Decision.DENY:
                why = f": {decided.reason}" if decided.reason else ""
                return Settle(use, ok=False, output=f"a person denied this call of {name}{why}")
        return Execute(use)
    return Park(waiting) if waiting else None
