"""The guard: the checks that stop a run before its next step. Pure, no I/O.

Defence in depth against a runaway agent: a cancel flag, a wall-clock deadline, a token budget, an
optional cost budget and a step cap. Budgets are checked before a model step only, so a run that
already has its final answer is not failed for the tokens that answer cost, and overshoot is bounded
by one step.

The step cap is hard: a run never writes more than `max_steps` steps, model and tool steps alike. A
model step is taken only while fewer than `max_steps` steps exist, and a turn's tool calls are run only
if all of them fit: a turn asking for 2 tools with 1 step left ends the run FAILED before any of them
runs (half a turn's results could never be sent back to the model anyway).
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from agentrun.worker.core.records import Progress, Run, RunStatus


@dataclasses.dataclass(frozen=True)
class Stop:
    status: RunStatus
    reason: str
    output: Any = None  # a SUCCEEDED run's answer: its final text, or its structured value


def guard(run: Run, progress: Progress, steps: int, *, before_model_step: bool, owed: int = 0) -> Stop | None:
    """Why the run must stop before its next step, or None. `owed`: tool steps the current turn has
    still to write (checked against the step cap before its first tool runs)."""
    if progress.cancel_requested:
        return Stop(RunStatus.CANCELLED, "cancel requested")
    if progress.db_now >= run.deadline_at:
        return deadline_passed(run)
    if not before_model_step:
        if steps + owed > run.max_steps:
            calls = "1 tool call" if owed == 1 else f"{owed} tool calls"
            return Stop(
                RunStatus.FAILED,
                f"step cap reached: the model asked for {calls} at step {steps} of at most {run.max_steps}, "
                "more than the cap leaves; they were not run",
            )
        return None
    if progress.tokens_used >= run.token_budget:
        return Stop(
            RunStatus.FAILED, f"token budget exhausted: used {progress.tokens_used} of {run.token_budget} tokens"
        )
    if run.cost_budget_usd is not None and progress.cost_usd >= run.cost_budget_usd:
        return Stop(
            RunStatus.FAILED, f"cost budget exhausted: spent ${progress.cost_usd:.4f} of ${run.cost_budget_usd:.4f}"
        )
    if steps >= run.max_steps:
        return Stop(RunStatus.FAILED, f"step cap reached: {steps} steps of at most {run.max_steps}")
    return None


def final(stop_reason: str | None, max_tokens: int, ignored_tool_uses: int = 0) -> Stop:
    """How a run ends when the model stops without asking for a tool.

    A natural end (`end_turn`, a stop sequence) succeeds. An answer cut off by `max_tokens`, a refusal
    or a full context window is not the answer the run was for: it fails, saying why, rather than
    passing a truncated or empty reply off as success. Tool calls in a cut-off answer are never run
    (the last one may be half-written); `ignored_tool_uses` says how many there were.
    """
    if stop_reason == "max_tokens":
        calls = ""
        if ignored_tool_uses:
            n = "tool call was" if ignored_tool_uses == 1 else f"{ignored_tool_uses} tool calls were"
            calls = f"; its {n} not run"
        return Stop(RunStatus.FAILED, f"the model's answer was cut off at max_tokens={max_tokens}{calls}")
    if stop_reason == "refusal":
        return Stop(RunStatus.FAILED, "the model declined to answer (stop_reason refusal)")
    if stop_reason == "model_context_window_exceeded":
        return Stop(RunStatus.FAILED, "the conversation outgrew the model's context window")
    return Stop(RunStatus.SUCCEEDED, "")


def deadline_passed(run: Run) -> Stop:
    return Stop(RunStatus.TIMED_OUT, f"deadline passed: the run may take {run.timeout_seconds}s")


def remaining(run: Run, db_now: datetime.datetime) -> float:
    """Seconds left before the run's deadline, by the database's clock."""
    return (run.deadline_at - db_now).total_seconds()
