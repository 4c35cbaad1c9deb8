"""A replay run's tool calls in a real worker (in process) over real PostgreSQL: served from the recording and
marked, never executed; blocked or run live per the tool policy when the recording has no match."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agentrun.worker.core.recording import NOT_RECORDED, Change, NewReplay, ToolPolicy
from agentrun.worker.core.records import Run, RunStatus, Step, StepKind
from agentrun.worker.core.submission import Caller
from agentrun.worker.runtime.door import Door
from agentrun.worker.store import RunStore
from agentrun.worker.tools import ToolBox, load_tool_modules
from tests.replays.conftest import recorded
from tests.replays.model import RECORDED_MODEL, REPLAY_MODEL, PlanLlm, plan
from tests.replays.tools import LOG_ENV, executed
from tests.support.builders import new_run, worker
from tests.support.running import finished, running

CHARGE = ("charge", {"amount": 5, "to": "bob"})
LOOKUP = ("lookup", {"q": "x"})
TOOLS = ("charge", "lookup", "notify", "count", "wait")


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    path = str(tmp_path / "executed.log")
    monkeypatch.setenv(LOG_ENV, path)
    return path


def _box() -> ToolBox:
    return ToolBox(load_tool_modules(["tests.replays.tools"]))


async def _replayed(store: RunStore, runs: list[Run], **kw: Any) -> list[Run]:
    """Replay `runs` on the replay model (with `kw` for the replay) by an in-process worker; the replay runs,
    finished, in the order of `runs`."""
    fields: dict[str, Any] = {"id": uuid.uuid4(), "request": {}, "change": Change(model=REPLAY_MODEL)}
    fields.update(kw)
    replay = NewReplay(**fields)
    await Door(store).replay(replay, runs, Caller())
    mine = {r.replay_of: r for r in await store.list_runs() if r.replay_id == replay.id}
    async with running(worker(store, PlanLlm(), _box())):
        return [await finished(store, mine[r.id].id, 30) for r in runs]


async def _tool_steps(store: RunStore, run: Run) -> list[Step]:
    return [s for s in await store.steps(run.id) if s.kind is StepKind.TOOL and not s.inherited]


async def test_recorded_by_a_worker_replayed_on_another_model_the_tool_never_runs(store: RunStore, log: str) -> None:
    runs = []
    async with running(worker(store, PlanLlm(), _box())):
        for who in ("bob", "ann"):
            made, _ = await store.create(new_run(plan(("charge", {"amount": 5, "to": who}), LOOKUP),
                                                 model=RECORDED_MODEL, tools=TOOLS))
            runs.append(await finished(store, made.id, 30))
    assert [r.status for r in runs] == [RunStatus.SUCCEEDED] * 2
    ran = executed(log)
    assert len(ran) == 4

    replays = await _replayed(store, runs)
    assert executed(log) == ran  # the non-idempotent tool (and the other) never ran
    for mine, source in zip(replays, runs, strict=True):
        assert mine.status is RunStatus.SUCCEEDED, mine.error
        assert mine.output == source.output.replace(RECORDED_MODEL, REPLAY_MODEL)  # type: ignore[union-attr]
        served = await _tool_steps(store, mine)
        recorded_steps = await _tool_steps(store, source)
        assert [(s.recorded_seq, s.response, s.status, s.attempts) for s in served] == [
            (r.seq, r.response, r.status, 0) for r in recorded_steps]


async def test_the_kth_call_gets_the_kth_result_and_errors_are_served_as_errors(
    store: RunStore, db: psycopg.AsyncConnection[Any], log: str,
) -> None:
    source = await recorded(store, db, [(*CHARGE, "charged #1"), (*CHARGE, "charged #2"), ("lookup", {"q": "x"}, None)],
                            input=plan(CHARGE, CHARGE, LOOKUP, extra={REPLAY_MODEL: [CHARGE]}), tools=TOOLS)
    await db.execute("UPDATE run_step SET status = 'ERROR', response = 'lookup failed' WHERE run_id = %s AND seq = 6",
                     (source.id,))
    (mine,) = await _replayed(store, [source])
    assert mine.status is RunStatus.SUCCEEDED, mine.error
    steps = await _tool_steps(store, mine)
    assert [(s.tool_name, s.recorded_seq, s.status.value) for s in steps] == [
        ("charge", 2, "DONE"), ("charge", 4, "DONE"), ("lookup", 6, "ERROR"), ("charge", None, "ERROR")]
    assert NOT_RECORDED in (steps[-1].response or "")
    assert mine.output == (f"{REPLAY_MODEL}: charged #1 | charged #2 | ERROR lookup failed | "
                           f"ERROR {steps[-1].response}")
    assert executed(log) == []


async def test_unmatched_calls_are_blocked_under_recorded(
    store: RunStore, db: psycopg.AsyncConnection[Any], log: str,
) -> None:
    extra = [("lookup", {"q": "y"}), ("notify", {"who": "ops"}), ("wait", {"seconds": 1}), ("agent__helper", {})]
    source = await recorded(store, db, [(*CHARGE, "charged 5 to bob")], input=plan(CHARGE, extra={REPLAY_MODEL: extra}),
                            tools=TOOLS)
    (mine,) = await _replayed(store, [source])
    assert mine.status is RunStatus.SUCCEEDED, mine.error
    steps = await _tool_steps(store, mine)
    assert [(s.tool_name, s.recorded_seq) for s in steps] == [
        ("charge", 2), ("lookup", None), ("notify", None), ("wait", None), ("agent__helper", None)]
    assert all(NOT_RECORDED in (s.response or "") and s.status.value == "ERROR" for s in steps[1:])
    assert executed(log) == []


async def test_under_live_readonly_only_a_read_only_idempotent_tool_runs(
    store: RunStore, db: psycopg.AsyncConnection[Any], log: str,
) -> None:
    extra = [("lookup", {"q": "y"}), ("charge", {"amount": 6}), ("notify", {"who": "ops"}), ("count", {}),
             ("wait", {"seconds": 1}), ("agent__helper", {})]
    source = await recorded(store, db, [(*CHARGE, "charged 5 to bob")], input=plan(CHARGE, extra={REPLAY_MODEL: extra}),
                            tools=TOOLS)
    (mine,) = await _replayed(store, [source], tool_policy=ToolPolicy.RECORDED_THEN_LIVE_READONLY)
    assert mine.status is RunStatus.SUCCEEDED, mine.error
    assert mine.tool_policy == "recorded_then_live_readonly"
    steps = await _tool_steps(store, mine)
    outcome = [(s.tool_name, s.recorded_seq, s.status.value) for s in steps]
    assert outcome == [("charge", 2, "DONE"), ("lookup", None, "DONE"), ("charge", None, "ERROR"),
                       ("notify", None, "ERROR"), ("count", None, "ERROR"), ("wait", None, "ERROR"),
                       ("agent__helper", None, "ERROR")]
    assert steps[1].response == "found y" and steps[1].attempts == 1
    assert "not read-only" in (steps[3].response or "") and "not idempotent" in (steps[4].response or "")
    assert executed(log) == ['lookup {"q": "y"}']  # the one live call


async def test_approvals_come_from_the_recording_and_a_replay_never_waits_for_a_person(
    store: RunStore, db: psycopg.AsyncConnection[Any], log: str,
) -> None:
    # The recorded call was approved (its result is what the approval led to); the replay's second call of
    # the same tool has no recorded result, and no approval.
    source = await recorded(store, db, [(*CHARGE, "charged 5 to bob")], input=plan(CHARGE, extra={
        REPLAY_MODEL: [("lookup", {"q": "z"})]}), tools=TOOLS, require_approval=("charge", "lookup"))
    (mine,) = await _replayed(store, [source], tool_policy=ToolPolicy.RECORDED_THEN_LIVE_READONLY)
    assert mine.status is RunStatus.SUCCEEDED, mine.error
    steps = await _tool_steps(store, mine)
    assert [(s.tool_name, s.recorded_seq) for s in steps] == [("charge", 2), ("lookup", None)]
    assert "approval is not in the recording" in (steps[1].response or "")
    assert await store.decisions(mine.id) == []
    assert executed(log) == []


async def test_from_seq_serves_only_the_calls_after_it(store: RunStore, db: psycopg.AsyncConnection[Any], log: str) -> None:
    source = await recorded(store, db, [(*CHARGE, "charged 5 to bob"), ("lookup", {"q": "x"}, "found x")],
                            input=plan(CHARGE, LOOKUP), tools=TOOLS)
    (mine,) = await _replayed(store, [source], from_seq=3)  # keeps the charge and its result
    assert mine.status is RunStatus.SUCCEEDED, mine.error
    steps = [s for s in await store.steps(mine.id) if s.kind is StepKind.TOOL]
    assert [(s.tool_name, s.inherited, s.recorded_seq) for s in steps] == [("charge", True, None), ("lookup", False, 4)]
    assert mine.output == f"{REPLAY_MODEL}: charged 5 to bob | found x"
    assert executed(log) == []


async def test_a_call_in_doubt_in_a_replay_run_is_served_again_never_asked(
    store: RunStore, db: psycopg.AsyncConnection[Any], log: str,
) -> None:
    """A worker died between the STARTED row of a call and its result (in doubt, for a non-idempotent tool):
    the replay run's next worker serves it from the recording; it neither probes, nor asks a person, nor runs it."""
    source = await recorded(store, db, [(*CHARGE, "charged 5 to bob")], input=plan(CHARGE), tools=TOOLS)
    replay = NewReplay(id=uuid.uuid4(), request={}, change=Change(model=REPLAY_MODEL))
    await Door(store).replay(replay, [source], Caller())
    (run,) = [r for r in await store.list_runs() if r.replay_id == replay.id]
    use = [{"type": "tool_use", "id": "toolu_0_0", "name": "charge", "input": {"to": "bob", "amount": 5}}]
    import json

    await db.execute("""INSERT INTO run_step (run_id, seq, kind, status, request, response, stop_reason, finished_at)
                        VALUES (%s, 1, 'MODEL', 'DONE', '{}', %s, 'tool_use', now())""", (run.id, json.dumps(use)))
    await db.execute("""INSERT INTO run_step (run_id, seq, kind, status, tool_name, tool_use_id, request, worker)
                        VALUES (%s, 2, 'TOOL', 'STARTED', 'charge', 'toolu_0_0', '{"to":"bob","amount":5}', 'gone')""",
                     (run.id,))
    await db.execute("UPDATE run SET crashes = 1 WHERE id = %s", (run.id,))
    async with running(worker(store, PlanLlm(), _box())):
        done = await finished(store, run.id, 30)
    assert done.status is RunStatus.SUCCEEDED, done.error
    (step,) = await _tool_steps(store, done)
    assert (step.seq, step.status.value, step.recorded_seq, step.response) == (2, "DONE", 2, "charged 5 to bob")
    assert await store.decisions(run.id) == []
    assert executed(log) == []
