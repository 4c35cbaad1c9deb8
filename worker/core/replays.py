"""A replay's report: how a replayed run compares with the run it replays, and the scorer's verdict. Pure, no I/O.

Each pair (recorded, replayed) is compared on its final status, its output (exactly, and against the run's
output schema), the tool calls the model made (names and inputs, as an edit distance), steps, tokens, cost and
latency; a scorer then says pass or fail. The diff is JSON in the API's casing, stored once per pair.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from agentrun.worker.core.answer import FINAL_ANSWER, problem
from agentrun.worker.core.recording import canonical
from agentrun.worker.core.records import Run, RunStatus, Step, StepKind

EXACT = "exact"
SCHEMA_VALID = "schema_valid"
SAME_TOOL_CALLS = "same_tool_calls"
BUILT_IN = (EXACT, SCHEMA_VALID, SAME_TOOL_CALLS)
DEFAULT_SCORER = SAME_TOOL_CALLS

MAX_SCORER_ERROR = 500
"""Characters of a custom scorer's error kept in the diff."""

MAX_SHOWN_CALLS = 200
"""Tool call names listed per side in a diff; the distance counts them all."""


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """A tool call the model asked for: its name and its input in canonical JSON, as a replay matches calls
    (core/recording.py `canonical`: keys sorted, no whitespace)."""

    name: str
    input: str


@dataclasses.dataclass(frozen=True)
class RunView:
    """What a scorer sees of a run: its fields that matter to a comparison, its tool calls and its output."""

    id: uuid.UUID
    status: str
    output: Any
    output_schema: Mapping[str, Any] | None
    tool_calls: tuple[ToolCall, ...]
    steps: int
    tokens: int
    cost_usd: Decimal
    model: str
    system: str | None
    input: str
    error: str | None = None
    started_at: datetime.datetime | None = None
    finished_at: datetime.datetime | None = None

    @property
    def finished(self) -> bool:
        return RunStatus(self.status).terminal

    @property
    def latency_ms(self) -> int | None:
        """From its start to its end; None while it has not ended (or never started)."""
        if self.started_at is None or self.finished_at is None:
            return None
        return max(0, round((self.finished_at - self.started_at).total_seconds() * 1000))


def view_of(run: Run, steps: Iterable[Step]) -> RunView:
    """What a scorer sees of `run`, given its steps (its MODEL steps are enough: the tool calls are read there)."""
    return RunView(
        id=run.id, status=run.status.value, output=run.output, output_schema=run.output_schema,
        tool_calls=tool_calls_of(steps), steps=run.steps, tokens=run.tokens_used_total, cost_usd=run.cost_usd_total,
        model=run.model, system=run.system, input=run.input, error=run.error, started_at=run.started_at,
        finished_at=run.finished_at)


Scorer = Callable[[RunView, RunView], Any]
"""A custom scorer (`module:function`): both runs in, a bool or `{"pass": bool, ...}` out."""


def tool_calls_of(steps: Iterable[Step]) -> tuple[ToolCall, ...]:
    """The tool calls a run's model asked for, in order, from its MODEL steps' responses: what it chose to do,
    whether or not the call then ran. `final_answer` is the run's output, compared as such, not a call."""
    calls: list[ToolCall] = []
    for step in sorted(steps, key=lambda s: s.seq):
        if step.kind is not StepKind.MODEL or not step.response:
            continue
        try:
            content = json.loads(step.response)
        except ValueError:
            continue
        for block in content if isinstance(content, list) else ():
            if isinstance(block, dict) and block.get("type") == "tool_use" and block.get("name") != FINAL_ANSWER:
                calls.append(ToolCall(str(block.get("name")), canonical(block.get("input"))))
    return tuple(calls)


def distance(a: Sequence[ToolCall], b: Sequence[ToolCall]) -> int:
    """Levenshtein distance between two call sequences: insertions, deletions and substitutions of whole
    calls (a call with the same name and another input is a substitution)."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def output_problem(run: RunView) -> str | None:
    """Why a run's output is not a valid answer: against its output schema when it has one, else none at all."""
    if not run.finished or run.status != RunStatus.SUCCEEDED:
        return f"the run is {run.status}, with no answer"
    if run.output_schema is not None:
        return problem(run.output_schema, run.output)
    if run.output is None:
        return "no output"
    return None


def _succeeded(status: str) -> bool:
    return status == RunStatus.SUCCEEDED


def _pair(recorded: Any, replayed: Any) -> dict[str, Any]:
    return {"recorded": recorded, "replayed": replayed}


def _usd(value: Decimal) -> float:
    return float(value)


def compare(recorded: RunView, replayed: RunView) -> dict[str, Any]:
    """The diff of a finished pair, as stored and served (camelCase)."""
    problem_now = output_problem(replayed)
    first = next((i for i, (x, y) in enumerate(zip(recorded.tool_calls, replayed.tool_calls, strict=False))
                  if x != y), None)
    if first is None and len(recorded.tool_calls) != len(replayed.tool_calls):
        first = min(len(recorded.tool_calls), len(replayed.tool_calls))
    latency = _pair(recorded.latency_ms, replayed.latency_ms)
    return {
        "status": {**_pair(recorded.status, replayed.status), "same": recorded.status == replayed.status},
        "output": {
            **_pair(recorded.output, replayed.output),
            "equal": recorded.output == replayed.output,
            "schemaValid": problem_now is None,
            "schemaProblem": problem_now,
        },
        "toolCalls": {
            "distance": distance(recorded.tool_calls, replayed.tool_calls),
            "firstDifference": first,
            **_pair([c.name for c in recorded.tool_calls[:MAX_SHOWN_CALLS]],
                    [c.name for c in replayed.tool_calls[:MAX_SHOWN_CALLS]]),
            "count": _pair(len(recorded.tool_calls), len(replayed.tool_calls)),
        },
        "steps": _pair(recorded.steps, replayed.steps),
        "tokens": _pair(recorded.tokens, replayed.tokens),
        "costUsd": _pair(_usd(recorded.cost_usd), _usd(replayed.cost_usd)),
        "latencyMs": latency,
        "error": _pair(recorded.error, replayed.error),
    }


def built_in_pass(scorer: str, diff: Mapping[str, Any]) -> bool:
    """The verdict of a built-in scorer on a pair's diff."""
    status, output, calls = diff["status"], diff["output"], diff["toolCalls"]
    if scorer == EXACT:
        return bool(status["same"] and output["equal"])
    if scorer == SCHEMA_VALID:
        return bool(_succeeded(status["replayed"]) and output["schemaValid"])
    if scorer == SAME_TOOL_CALLS:
        same_class = _succeeded(status["recorded"]) == _succeeded(status["replayed"])
        return bool(same_class and calls["distance"] == 0)
    raise ValueError(f"unknown built-in scorer {scorer!r}")


def custom_verdict(result: Any) -> tuple[bool, dict[str, Any]] | str:
    """A custom scorer's result as (pass, extra diff), or why it is not one: a bool, or a JSON object with a
    boolean `pass` whose other members are JSON."""
    if isinstance(result, bool):
        return result, {}
    if isinstance(result, Mapping) and isinstance(result.get("pass"), bool):
        extra = {str(k): v for k, v in result.items() if k != "pass"}
        try:
            json.dumps(extra, allow_nan=False)
        except (TypeError, ValueError) as e:
            return f"its result is not JSON: {e}"
        return bool(result["pass"]), extra
    shown = repr(result)
    return (f"returned {shown[:100]}{'…' if len(shown) > 100 else ''}: "
            "a scorer returns a bool or an object with a boolean \"pass\"")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A scored pair: pass (None: it could not be judged) and the diff stored with it."""

    passed: bool | None
    diff: dict[str, Any]


def missing_recording(recorded_run_id: uuid.UUID | None, replayed: RunView) -> Verdict:
    """A pair whose recorded run is gone (pruned since the replay was made): nothing to compare with."""
    return Verdict(None, {
        "recordedMissing": True,
        "error": f"the recorded run {recorded_run_id} no longer exists (pruned since the replay was made)",
        "status": _pair(None, replayed.status),
        "tokens": _pair(None, replayed.tokens),
        "costUsd": _pair(None, _usd(replayed.cost_usd)),
    })


def judge(scorer: str, recorded: RunView, replayed: RunView, custom: Scorer | None = None) -> Verdict:
    """Compare a finished pair and apply the scorer: a built-in one by its name, or `custom` (the callable
    `scorer` names). A custom scorer that raises or returns something else than a verdict fails the pair
    with the reason in its diff; it never fails the caller. Runs the custom scorer in the calling thread."""
    diff = compare(recorded, replayed)
    diff["scorer"] = scorer
    if custom is None:
        return Verdict(built_in_pass(scorer, diff), diff)
    try:
        result = custom(recorded, replayed)
    except Exception as e:  # a scorer is foreign code: its failure is the pair's, reported in its diff
        diff["scorerError"] = f"{type(e).__name__}: {e}"[:MAX_SCORER_ERROR]
        return Verdict(False, diff)
    return custom_result(diff, result)


def custom_result(diff: dict[str, Any], result: Any) -> Verdict:
    """The verdict of a custom scorer's `result` on a pair whose comparison is `diff`."""
    verdict = custom_verdict(result)
    if isinstance(verdict, str):
        diff["scorerError"] = verdict[:MAX_SCORER_ERROR]
        return Verdict(False, diff)
    passed, extra = verdict
    if extra:
        diff["scorerDetail"] = extra
    return Verdict(passed, diff)


def pass_rate(verdicts: Iterable[bool | None]) -> float | None:
    """Passed pairs over judged ones; None while none is judged."""
    judged = [v for v in verdicts if v is not None]
    return sum(judged) / len(judged) if judged else None


def scorer_problem(name: str, allowed: Iterable[str]) -> str | None:
    """Why `name` is not a scorer a replay may use: a built-in one, or a `module:function` in configuration."""
    if name in BUILT_IN:
        return None
    listed = tuple(allowed)
    if ":" not in name:
        return f"must be one of {', '.join(BUILT_IN)} or a `module:function` listed in AGENTRUN_REPLAY_SCORERS"
    if name not in listed:
        return f"{name!r} is not listed in AGENTRUN_REPLAY_SCORERS" + (
            f" (listed: {', '.join(listed)})" if listed else " (none is)")
    return None


def scorers_setting(text: str | None) -> tuple[str, ...]:
    """AGENTRUN_REPLAY_SCORERS: comma-separated `module:function` names; ValueError naming a bad one."""
    names = tuple(dict.fromkeys(n.strip() for n in (text or "").split(",") if n.strip()))
    for name in names:
        module, _, function = name.partition(":")
        if not module or not function or not all(p.isidentifier() for p in (*module.split("."), function)):
            raise ValueError(f"AGENTRUN_REPLAY_SCORERS: {name!r} is not `module:function`")
    return names
