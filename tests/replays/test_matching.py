"""The matching rule of a replay (core/recording.py), pure: canonical inputs, the k-th call gets the k-th
recorded result, why an unmatched call is blocked, and where a replay starts."""

from __future__ import annotations

import datetime
import json
import uuid
from decimal import Decimal
from typing import Any

import pytest

from agentrun.worker.core.recording import (
    NOT_RECORDED,
    Abilities,
    Recording,
    ToolPolicy,
    blocked_because,
    canonical,
    conversation_start,
)
from agentrun.worker.core.records import Run, RunStatus, Step, StepKind, StepStatus
from agentrun.worker.core.submission import Refused

NOW = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
RUN = uuid.UUID(int=1)


def _tool(seq: int, name: str, tool_input: Any, response: str = "ok", status: StepStatus = StepStatus.DONE,
          request: str | None = None) -> Step:
    return Step(RUN, seq, StepKind.TOOL, status, tool_name=name, tool_use_id=f"t{seq}",
                request=request if request is not None else json.dumps(tool_input), response=response)


def test_canonical_input_ignores_key_order_and_whitespace_only() -> None:
    assert canonical({"b": 1, "a": [2, {"d": 1, "c": 2}]}) == '{"a":[2,{"c":2,"d":1}],"b":1}'
    assert canonical(json.loads('{ "a" :  1,\n"b":"x y" }')) == canonical({"b": "x y", "a": 1})
    assert canonical({"a": "x"}) != canonical({"a": "x "})  # strings exactly
    assert canonical({"a": "é"}) != canonical({"a": "e\u0301"})  # no Unicode normalisation
    assert canonical([1, 2]) != canonical([2, 1])  # arrays keep their order
    assert canonical(1) != canonical(1.0) and canonical(json.loads("1e2")) == canonical(100.0)


def test_the_kth_call_of_a_key_gets_the_kth_recorded_result() -> None:
    recorded = [_tool(2, "charge", {"a": 1}, "first"), _tool(4, "lookup", {"q": 1}, "found"),
                _tool(6, "charge", {"a": 1}, "second", StepStatus.ERROR), _tool(8, "charge", {"a": 2}, "other"),
                _tool(9, "charge", {"a": 3}, status=StepStatus.STARTED)]  # never finished: nothing to serve
    rec = Recording(recorded, [], lambda name: False)
    assert rec.take("lookup", {"q": 1}) is recorded[1]  # out of order: by key, not position
    assert rec.take("charge", {"a": 1}) is recorded[0]
    assert rec.take("charge", {"a": 1}) is recorded[2]
    assert rec.take("charge", {"a": 1}) is None  # a third one was never made
    assert rec.take("charge", {"a": 3}) is None
    assert rec.take("charge", {"a": 2}) is recorded[3]


def test_what_the_replay_took_is_counted_from_its_own_steps() -> None:
    """After a crash the replay's finished TOOL steps say what was taken: served, blocked or run alike; a
    STARTED one is the call still owed."""
    recorded = [_tool(2, "charge", {"a": 1}, "first"), _tool(4, "charge", {"a": 1}, "second")]
    replayed = [_tool(2, "charge", {}, "first", request='{ "a": 1 }'), _tool(4, "charge", {"a": 1}, status=StepStatus.STARTED)]
    rec = Recording(recorded, replayed, lambda name: False)
    assert rec.take("charge", {"a": 1}) is recorded[1]


def test_skipped_names_are_neither_served_nor_counted() -> None:
    recorded = [_tool(2, "final_answer", {"x": 1}, "accepted")]
    assert Recording(recorded, [], lambda name: name == "final_answer").take("final_answer", {"x": 1}) is None


ABLE = Abilities(known=True, read_only=True, idempotent=True, destructive=False, needs_approval=False)


@pytest.mark.parametrize(("policy", "tool", "why"), [
    (ToolPolicy.RECORDED, ABLE, "runs no tool"),
    (ToolPolicy.RECORDED_THEN_LIVE_READONLY, ABLE, None),
    (ToolPolicy.RECORDED_THEN_LIVE_READONLY, Abilities(True, False, True, False, False), "not read-only"),
    (ToolPolicy.RECORDED_THEN_LIVE_READONLY, Abilities(True, True, False, False, False), "not idempotent"),
    (ToolPolicy.RECORDED_THEN_LIVE_READONLY, Abilities(True, True, True, True, False), "destructive"),
    (ToolPolicy.RECORDED_THEN_LIVE_READONLY, Abilities(True, True, True, False, True), "approval is not in the recording"),
    (ToolPolicy.RECORDED, Abilities(True, True, True, False, True), "approval is not in the recording"),
    (ToolPolicy.RECORDED_THEN_LIVE_READONLY, Abilities(False, False, False, False, False), "sub-agent, a wait"),
])
def test_an_unmatched_call_runs_only_if_the_policy_and_the_tool_allow(
    policy: ToolPolicy, tool: Abilities, why: str | None,
) -> None:
    found = blocked_because(policy, "t", tool)
    if why is None:
        assert found is None
    else:
        assert found is not None and NOT_RECORDED in found and why in found


def _run(**kw: Any) -> Run:
    fields: dict[str, Any] = dict(
        id=RUN, status=RunStatus.SUCCEEDED, input="q", model="m", system=None, tools=None, token_budget=10,
        tokens_used=0, cost_budget_usd=None, cost_usd=Decimal(0), max_steps=10, timeout_seconds=10, deadline_at=NOW,
        cancel_requested=False, error=None, locked_by=None, locked_until=None, created_at=NOW, started_at=NOW,
        finished_at=NOW, steps=5)
    fields.update(kw)
    return Run(**fields)


def test_where_a_replay_starts() -> None:
    parent = uuid.UUID(int=2)
    assert conversation_start(_run(), None) is None  # a fresh run: from its input
    assert conversation_start(_run(parent_run_id=parent, parent_tool_use_id="t"), None) is None  # a sub-agent's
    assert conversation_start(_run(parent_run_id=parent, inherited_steps=3), None) == 4  # a continuation
    assert conversation_start(_run(parent_run_id=parent, forked_at_seq=2, inherited_steps=2), None) == 2  # a fork
    assert conversation_start(_run(), 2) == 1 and conversation_start(_run(), 6) == 5
    for bad in (0, 1, 7):
        with pytest.raises(Refused) as refused:
            conversation_start(_run(), bad)
        assert refused.value.problems[0].field == "fromSeq"
