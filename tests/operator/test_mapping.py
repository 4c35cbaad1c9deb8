"""AgentRun ⇄ run mapping: pure functions, no I/O."""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from decimal import Decimal

import pytest

from agentrun.operator import mapping
from agentrun.worker.core.records import Run, RunStatus

UID = "6f1c0a52-1111-2222-3333-444455556666"
NOW = datetime.datetime(2025, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)


def _run(**kw: object) -> Run:
    fields: dict[str, object] = dict(
        id=uuid.UUID(UID), status=RunStatus.QUEUED, input="x", model="m", system=None, tools=None,
        token_budget=100, tokens_used=0, cost_budget_usd=None, cost_usd=Decimal("0"), max_steps=10,
        timeout_seconds=60, deadline_at=NOW, cancel_requested=False, error=None, locked_by=None,
        locked_until=None, created_at=NOW, started_at=None, finished_at=None, steps=0,
        k8s_namespace="ns", k8s_name="a",
    )
    fields.update(kw)
    return Run(**fields)  # type: ignore[arg-type]


def test_minimal_spec_takes_the_defaults() -> None:
    new = mapping.new_run({"input": "hi"}, UID, "ns", "a")
    assert (new.id, new.k8s_namespace, new.k8s_name) == (uuid.UUID(UID), "ns", "a")
    assert (new.model, new.token_budget, new.timeout_seconds, new.max_steps) == (
        "claude-sonnet-4-6", mapping.DEFAULT_TOKEN_BUDGET, mapping.DEFAULT_TIMEOUT_SECONDS, 100)
    assert new.tools is None and new.cost_budget_usd is None


def test_cost_budget_keeps_its_decimal_value() -> None:
    assert mapping.new_run({"input": "hi", "costBudgetUsd": 0.1}, UID, "ns", "a").cost_budget_usd == Decimal("0.1")


@pytest.mark.parametrize("spec, words", [
    ({"input": ""}, "input"),
    ({"input": "x", "tokenBudget": -1}, "tokenBudget"),
    ({"input": "x", "maxSteps": True}, "maxSteps"),
    ({"input": "x", "costBudgetUsd": "free"}, "costBudgetUsd"),
    ({"input": "x", "costBudgetUsd": 0}, "costBudgetUsd"),
    ({"input": "x", "tools": ["lookup", "teleport"]}, "teleport"),
])
def test_specs_the_runtime_cannot_run(spec: dict[str, object], words: str) -> None:
    with pytest.raises(mapping.InvalidSpec, match=words):
        mapping.new_run(spec, UID, "ns", "a", known_tools={"lookup"})


def test_unknown_tools_pass_when_the_workers_tools_are_not_known() -> None:
    assert mapping.new_run({"input": "x", "tools": ["teleport"]}, UID, "ns", "a").tools == ("teleport",)


@pytest.mark.parametrize("status", list(RunStatus))
def test_every_run_status_has_a_phase(status: RunStatus) -> None:
    """Every status the runtime has, not only those the mapping knows: a new one must get a phase."""
    assert status in mapping.PHASES, f"RunStatus.{status.name} has no AgentRun phase"
    phase = mapping.run_status(_run(status=status, locked_by="w"), 1, None, NOW)["phase"]
    assert phase == mapping.PHASES[status]
    assert (phase in mapping.FINISHED_PHASES) == status.terminal
    assert mapping.event_for(phase, "") is not None  # and every phase is announced


def test_a_run_handed_back_in_an_outage_says_when_it_is_retried() -> None:
    later = NOW + datetime.timedelta(minutes=5)
    run = _run(status=RunStatus.QUEUED, model_retries=2, run_at=later, started_at=NOW, steps=1)
    status = mapping.run_status(run, 1, None, NOW)
    assert status["phase"] == "Queued"
    assert status["message"] == "handed back after 2 failed model steps; to be retried from 2025-01-02T03:09:05+00:00"


def test_status_of_a_finished_run() -> None:
    run = _run(status=RunStatus.FAILED, error="model said no", tokens_used=42, cost_usd=Decimal("0.0123"),
               steps=3, locked_by="w", started_at=NOW, finished_at=NOW)
    status = mapping.run_status(run, 2, None, NOW)
    assert status["costUsd"] == "0.012300" and status["tokensUsed"] == 42 and status["steps"] == 3
    assert status["message"] == "model said no" and status["finishedAt"] == "2025-01-02T03:04:05Z"
    assert status["observedGeneration"] == 2
    succeeded = {c["type"]: c for c in status["conditions"]}["Succeeded"]
    assert (succeeded["status"], succeeded["reason"]) == ("False", "Failed")


def test_conditions_keep_their_transition_time_while_unchanged() -> None:
    first = mapping.run_status(_run(), 1, None, NOW)
    later = NOW + datetime.timedelta(minutes=5)
    running = mapping.run_status(_run(status=RunStatus.RUNNING, locked_by="w"), 1, first, later)
    by_type = {c["type"]: c for c in running["conditions"]}
    assert by_type["Ready"]["lastTransitionTime"] == "2025-01-02T03:04:05Z"  # still True
    assert by_type["Succeeded"]["lastTransitionTime"] == "2025-01-02T03:04:05Z"  # still Unknown
    assert not mapping.visible_change(first, mapping.run_status(_run(), 1, first, later))
    assert mapping.visible_change(first, running)


def test_status_patch_removes_fields_that_went_away() -> None:
    assert mapping.status_patch({"phase": "Failed", "message": "m", "x": 1}, {"phase": "Queued", "message": "m"}) \
        == {"phase": "Queued", "message": "m", "x": None}


def test_events_for_phases() -> None:
    assert mapping.event_for("Failed", "boom") == ("Warning", "Failed", "boom")
    assert mapping.event_for("Queued", "")[:2] == ("Normal", "Queued")  # type: ignore[index]
    assert mapping.event_for("Pending", "db down") == ("Warning", "Pending", "db down")
    assert mapping.event_for("Unheard-of", "") is None


def test_a_fast_run_announces_every_phase_it_went_through() -> None:
    done = _run(status=RunStatus.SUCCEEDED, started_at=NOW, finished_at=NOW, locked_by="w")
    assert [e[1] for e in mapping.phase_events(None, done)] == ["Queued", "Running", "Succeeded"]
    assert [e[1] for e in mapping.phase_events("Queued", done)] == ["Running", "Succeeded"]
    assert mapping.phase_events("Queued", done)[0] == ("Normal", "Running", "running on w")
    assert [e[1] for e in mapping.phase_events("Running", done)] == ["Succeeded"]
    assert mapping.phase_events("Succeeded", done) == []
    # Cancelled before any worker took it: it never ran, so no Running is made up.
    cancelled = _run(status=RunStatus.CANCELLED, finished_at=NOW)
    assert [e[1] for e in mapping.phase_events("Queued", cancelled)] == ["Cancelled"]
    failed = _run(status=RunStatus.FAILED, started_at=NOW, error="boom")
    assert mapping.phase_events("Pending", failed)[-1] == ("Warning", "Failed", "boom")
    assert [e[1] for e in mapping.phase_events("Pending", _run())] == ["Queued"]


def test_ttl_expiry() -> None:
    ref = mapping.Ref(uuid.UUID(UID), "ns", "a", 1, {}, ttl_seconds=30)
    done = {"phase": "Succeeded", "finishedAt": "2025-01-02T03:04:05Z"}
    assert mapping.expires_at(ref, done) == NOW + datetime.timedelta(seconds=30)
    assert mapping.expires_at(ref, {"phase": "Running"}) is None
    assert mapping.expires_at(dataclasses.replace(ref, ttl_seconds=None), done) is None


def test_a_cost_budget_needs_a_priced_model() -> None:
    from agentrun.worker.core.pricing import PriceTable, cost_budget_problem

    prices = PriceTable.load()
    assert cost_budget_problem(prices, "claude-imaginary-9", Decimal("1")) is not None
    assert cost_budget_problem(prices, "claude-imaginary-9", None) is None
    assert cost_budget_problem(prices, mapping.DEFAULT_MODEL, Decimal("1")) is None
    with pytest.raises(mapping.InvalidSpec, match="no price"):
        mapping.new_run({"input": "x", "model": "claude-imaginary-9", "costBudgetUsd": 1}, UID, "ns", "a",
                        prices=prices)


def test_a_call_in_doubt_again_is_a_new_decision_required_event() -> None:
    """A retried call interrupted again asks again: its second question has the same toolUseId, and the
    AgentRun may never have shown the run in between (both looks saw Waiting)."""
    from agentrun.worker.core.records import DecisionKind, PendingCall

    def waiting(attempt: int) -> dict[str, object]:
        call = PendingCall(uuid.UUID(UID), "t_pay", DecisionKind.IN_DOUBT, "pay", "{}", NOW, attempt=attempt)
        return mapping.run_status(_run(status=RunStatus.WAITING), 1, None, NOW, [call])

    first, second = waiting(1), waiting(2)
    assert first["pending"][0]["attempt"] == 1  # type: ignore[index]
    assert mapping.decision_events(first, waiting(1)) == []  # the same question: no second Event
    [event] = mapping.decision_events(first, second)
    assert event[1] == "DecisionRequired" and "t_pay" in event[2] and "attempt 2" in event[2]
