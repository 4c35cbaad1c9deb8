"""The report of a replay, pure: how a pair (recorded, replayed) compares, and each scorer's verdict."""

from __future__ import annotations

import datetime
import json
import uuid
from decimal import Decimal
from typing import Any

import pytest

from agentrun.worker.core import replays
from agentrun.worker.core.recording import canonical
from agentrun.worker.core.records import Step, StepKind, StepStatus
from agentrun.worker.core.replays import RunView, ToolCall

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def view(status: str = "SUCCEEDED", output: Any = "done", calls: tuple[tuple[str, Any], ...] = (("lookup", {"q": 1}),),
         schema: dict[str, Any] | None = None, tokens: int = 100, cost: str = "0.01", seconds: float = 2.0,
         finished: bool = True) -> RunView:
    return RunView(
        id=uuid.uuid4(), status=status, output=output, output_schema=schema,
        tool_calls=tuple(ToolCall(n, canonical(i)) for n, i in calls), steps=2 * len(calls) + 1,
        tokens=tokens, cost_usd=Decimal(cost), model="m", system=None, input="hi",
        started_at=T0, finished_at=T0 + datetime.timedelta(seconds=seconds) if finished else None)


def test_calls_compare_as_a_replay_matches_them() -> None:
    assert replays.distance([ToolCall("a", canonical(json.loads('{"b": 1,  "a": [1, 2]}')))],
                            [ToolCall("a", canonical({"a": [1, 2], "b": 1}))]) == 0


def test_tool_calls_come_from_the_model_steps_without_final_answer() -> None:
    run_id = uuid.uuid4()

    def model(seq: int, blocks: list[dict[str, Any]]) -> Step:
        return Step(run_id, seq, StepKind.MODEL, StepStatus.DONE, response=json.dumps(blocks))

    steps = [
        model(3, [{"type": "tool_use", "id": "b", "name": "final_answer", "input": {"x": 1}}]),
        model(1, [{"type": "text", "text": "let me look"},
                  {"type": "tool_use", "id": "a", "name": "lookup", "input": {"z": 1, "a": 2}}]),
        Step(run_id, 2, StepKind.TOOL, StepStatus.DONE, tool_name="lookup", request='{"z":1,"a":2}', response="ok"),
        Step(run_id, 4, StepKind.MODEL, StepStatus.DONE, response="not json"),
    ]
    assert replays.tool_calls_of(steps) == (ToolCall("lookup", '{"a":2,"z":1}'),)


@pytest.mark.parametrize(("a", "b", "expected"), [
    ("", "", 0), ("abc", "abc", 0), ("abc", "", 3), ("", "ab", 2), ("kitten", "sitting", 3), ("abc", "acb", 2),
    ("abcd", "abd", 1),
])
def test_distance_is_levenshtein_over_calls(a: str, b: str, expected: int) -> None:
    def calls(s: str) -> list[ToolCall]:
        return [ToolCall(c, "{}") for c in s]

    assert replays.distance(calls(a), calls(b)) == expected == replays.distance(calls(b), calls(a))


def test_a_call_with_another_input_is_a_substitution() -> None:
    assert replays.distance([ToolCall("a", '{"x":1}')], [ToolCall("a", '{"x":2}')]) == 1


def test_the_diff_of_an_identical_pair() -> None:
    recorded, replayed = view(), view(tokens=50, cost="0.002", seconds=1.5)
    diff = replays.compare(recorded, replayed)
    assert diff["status"] == {"recorded": "SUCCEEDED", "replayed": "SUCCEEDED", "same": True}
    assert diff["output"] == {"recorded": "done", "replayed": "done", "equal": True, "schemaValid": True,
                              "schemaProblem": None}
    assert diff["toolCalls"] == {"distance": 0, "firstDifference": None, "recorded": ["lookup"],
                                 "replayed": ["lookup"], "count": {"recorded": 1, "replayed": 1}}
    assert diff["tokens"] == {"recorded": 100, "replayed": 50}
    assert diff["costUsd"] == {"recorded": 0.01, "replayed": 0.002}
    assert diff["latencyMs"] == {"recorded": 2000, "replayed": 1500}
    assert diff["steps"] == {"recorded": 3, "replayed": 3}
    json.dumps(diff, allow_nan=False)  # stored as JSONB as it is


def test_first_difference_of_the_calls() -> None:
    a = view(calls=(("x", {}), ("y", {})))
    assert replays.compare(a, view(calls=(("x", {}), ("z", {}))))["toolCalls"]["firstDifference"] == 1
    assert replays.compare(a, view(calls=(("x", {}),)))["toolCalls"]["firstDifference"] == 1
    assert replays.compare(a, view(calls=()))["toolCalls"]["firstDifference"] == 0


def judged(scorer: str, recorded: RunView, replayed: RunView) -> bool | None:
    return replays.judge(scorer, recorded, replayed).passed


def test_exact_wants_the_same_status_and_output() -> None:
    assert judged("exact", view(), view(calls=())) is True  # tool calls do not count
    assert judged("exact", view(), view(output="other")) is False
    assert judged("exact", view(), view(status="FAILED")) is False
    assert judged("exact", view(status="FAILED", output=None), view(status="FAILED", output=None)) is True


def test_schema_valid_wants_a_valid_answer() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    assert judged("schema_valid", view(), view(output={"n": 1}, schema=schema)) is True
    replayed = view(output={"n": "one"}, schema=schema)
    verdict = replays.judge("schema_valid", view(), replayed)
    assert verdict.passed is False
    assert verdict.diff["output"]["schemaValid"] is False and "n" in verdict.diff["output"]["schemaProblem"]
    assert judged("schema_valid", view(), view(output=None)) is False  # no schema: an output is wanted
    assert judged("schema_valid", view(), view(output="anything")) is True
    assert judged("schema_valid", view(), view(status="FAILED", output=None)) is False


def test_same_tool_calls_wants_the_same_status_class_and_calls() -> None:
    assert judged("same_tool_calls", view(), view(output="other words")) is True
    assert judged("same_tool_calls", view(), view(calls=(("lookup", {"q": 2}),))) is False
    assert judged("same_tool_calls", view(), view(status="FAILED")) is False
    assert judged("same_tool_calls", view(status="TIMED_OUT"), view(status="FAILED")) is True


def test_a_custom_scorer_gets_both_runs_and_may_add_to_the_diff() -> None:
    seen: list[tuple[RunView, RunView]] = []

    def scorer(recorded: RunView, replayed: RunView) -> dict[str, Any]:
        seen.append((recorded, replayed))
        return {"pass": replayed.tokens < recorded.tokens, "why": "cheaper"}

    recorded, replayed = view(), view(tokens=10)
    verdict = replays.judge("mod:scorer", recorded, replayed, scorer)
    assert seen == [(recorded, replayed)]
    assert verdict.passed is True
    assert verdict.diff["scorerDetail"] == {"why": "cheaper"} and verdict.diff["scorer"] == "mod:scorer"
    assert replays.judge("mod:scorer", recorded, replayed, lambda a, b: False).passed is False


@pytest.mark.parametrize(("scorer", "said"), [
    (lambda a, b: 1 / 0, "ZeroDivisionError"),
    (lambda a, b: "yes", "returned 'yes'"),
    (lambda a, b: None, "returned None"),
    (lambda a, b: {"pass": "true"}, "boolean"),
    (lambda a, b: {"pass": True, "x": object()}, "not JSON"),
    (lambda a, b: {"pass": True, "x": float("nan")}, "not JSON"),
])
def test_a_scorer_that_raises_or_returns_garbage_fails_its_pair(scorer: Any, said: str) -> None:
    verdict = replays.judge("mod:f", view(), view(), scorer)
    assert verdict.passed is False
    assert said in verdict.diff["scorerError"]
    json.dumps(verdict.diff, allow_nan=False)


def test_a_pair_whose_recording_is_gone() -> None:
    recorded_id = uuid.uuid4()
    verdict = replays.missing_recording(recorded_id, view())
    assert verdict.passed is None
    assert verdict.diff["recordedMissing"] is True and str(recorded_id) in verdict.diff["error"]


def test_latency_of_an_unfinished_run_is_unknown() -> None:
    running = view(status="RUNNING", finished=False)
    assert running.latency_ms is None and not running.finished


def test_pass_rate_counts_judged_pairs() -> None:
    assert replays.pass_rate([]) is None
    assert replays.pass_rate([None, None]) is None
    assert replays.pass_rate([True, False, None, True]) == pytest.approx(2 / 3)


def test_scorer_names() -> None:
    assert replays.scorer_problem("exact", ()) is None
    assert replays.scorer_problem("m:f", ("m:f",)) is None
    assert "not listed" in (replays.scorer_problem("m:g", ("m:f",)) or "")
    assert "one of" in (replays.scorer_problem("nope", ()) or "")


def test_the_scorers_setting() -> None:
    assert replays.scorers_setting(None) == ()
    assert replays.scorers_setting(" a.b:c , d:e,,a.b:c") == ("a.b:c", "d:e")
    for bad in ("nocolon", "a:", ":f", "a-b:c", "a:b c"):
        with pytest.raises(ValueError, match="AGENTRUN_REPLAY_SCORERS"):
            replays.scorers_setting(bad)
