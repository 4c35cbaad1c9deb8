"""The door's replays (runtime/door.py `Door.replay`): one run per recorded run, made with the replay row in one
transaction, planned as any run from the recorded run with the change applied."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from agentrun.worker.core.errors import OverQuota
from agentrun.worker.core.recording import Change, NewReplay, ToolPolicy
from agentrun.worker.core.records import Origin, RunStatus, StepKind
from agentrun.worker.core.submission import Caller, Refusal, Refused, RunSpec
from agentrun.worker.core.tenants import Quotas
from agentrun.worker.runtime.door import Door
from agentrun.worker.store import RunStore
from tests.replays.conftest import recorded

CALLS = [("charge", {"amount": 5, "to": "bob"}, "charged 5"), ("lookup", {"q": "x"}, "found x")]


def _replay(**kw: Any) -> NewReplay:
    fields: dict[str, Any] = {"id": uuid.uuid4(), "request": {"runs": []}}
    fields.update(kw)
    return NewReplay(**fields)


async def _count(db: psycopg.AsyncConnection[Any], query: str, *params: Any) -> int:
    row = await (await db.execute(query, params)).fetchone()
    assert row is not None
    return int(row[0])


async def test_one_run_per_recorded_run_inheriting_it_with_the_change(
    store: RunStore, db: psycopg.AsyncConnection[Any],
) -> None:
    a = await recorded(store, db, CALLS, system="be terse", tools=("charge", "lookup"), labels={"team": "billing"},
                       output_schema={"type": "string"}, token_budget=7000)
    b = await recorded(store, db, CALLS[:1], input="another")
    replay = _replay(change=Change(model="claude-haiku-4-5"), tool_policy=ToolPolicy.RECORDED_THEN_LIVE_READONLY)
    replay_id, created = await Door(store).replay(replay, [a, b], Caller(created_by="ann"))
    assert (replay_id, created) == (replay.id, True)

    runs = {r.replay_of: r for r in await store.list_runs() if r.replay_id == replay.id}
    assert set(runs) == {a.id, b.id}
    ra, rb = runs[a.id], runs[b.id]
    for mine, source in ((ra, a), (rb, b)):
        assert mine.origin == Origin.REPLAY.value and mine.status is RunStatus.QUEUED
        assert mine.tool_policy == "recorded_then_live_readonly" and mine.created_by == "ann"
        assert mine.model == "claude-haiku-4-5" and mine.input == source.input
        assert mine.parent_run_id is None and mine.steps == 0  # a fresh start from the same input
    assert (ra.system, ra.tools, ra.labels, ra.output_schema, ra.token_budget) == (
        "be terse", ("charge", "lookup"), {"team": "billing"}, {"type": "string"}, 7000)
    row = await (await db.execute(
        "SELECT tenant, created_by, tool_policy, scorer, from_seq, request FROM replay WHERE id = %s",
        (replay.id,))).fetchone()
    assert row == ("default", "ann", "recorded_then_live_readonly", "same_tool_calls", None, {"runs": []})
    # Only replay runs carry it.
    assert (a.replay_id, a.replay_of, a.tool_policy) == (None, None, None)


async def test_a_refused_run_leaves_no_replay_and_no_run(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    runs = [await recorded(store, db, CALLS, tenant="acme") for _ in range(3)]
    await store.set_quotas("acme", Quotas(max_queued=2))
    replay = _replay()
    with pytest.raises(OverQuota):
        await Door(store).replay(replay, runs, Caller(tenant="acme"))
    assert await _count(db, "SELECT count(*) FROM replay") == 0
    assert await _count(db, "SELECT count(*) FROM run WHERE replay_id IS NOT NULL OR origin = 'replay'") == 0

    # A change the policy refuses for one run is named as the replay's request names it; nothing written.
    with pytest.raises(Refused) as refused:
        await Door(store).replay(_replay(change=Change(tools=("charge", "nope"))), runs[:1], Caller(tenant="acme"),
                                 offer=_offer("charge", "lookup"))
    assert [p.field for p in refused.value.problems] == ["change.tools[1]"]
    assert await _count(db, "SELECT count(*) FROM replay") == 0


def _offer(*tools: str) -> Any:
    from agentrun.worker.core.submission import Offer

    return Offer(has_tool=lambda name: name in tools, tool_names=tools)


async def test_an_idempotency_key_returns_the_first_replay(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    a = await recorded(store, db, CALLS)
    first = _replay(idempotency_key="k1")
    assert await Door(store).replay(first, [a], Caller(idempotency_key="k1")) == (first.id, True)
    again = _replay(idempotency_key="k1", change=Change(model="claude-haiku-4-5"))
    assert await Door(store).replay(again, [a], Caller(idempotency_key="k1")) == (first.id, False)
    assert await _count(db, "SELECT count(*) FROM replay") == 1
    assert await _count(db, "SELECT count(*) FROM run WHERE replay_id IS NOT NULL") == 1
    # The key is the replay's, not its runs'; and another tenant's key is another's.
    assert await _count(db, "SELECT count(*) FROM run WHERE idempotency_key = 'k1'") == 0
    b = await recorded(store, db, CALLS, tenant="acme")
    other = _replay(idempotency_key="k1")
    assert await Door(store).replay(other, [b], Caller(tenant="acme")) == (other.id, True)


async def test_the_tenant_is_the_callers_and_another_tenants_run_is_not_found(
    store: RunStore, db: psycopg.AsyncConnection[Any],
) -> None:
    mine = await recorded(store, db, CALLS, tenant="acme")
    theirs = await recorded(store, db, CALLS, tenant="globex")
    with pytest.raises(Refused) as refused:
        await Door(store).replay(_replay(), [mine, theirs], Caller(tenant="acme"))
    assert refused.value.kind is Refusal.NOT_FOUND and refused.value.problems[0].field == "runs[1]"
    replay = _replay()
    await Door(store).replay(replay, [mine], Caller(tenant="acme"))
    (run,) = [r for r in await store.list_runs() if r.replay_id == replay.id]
    assert run.tenant == "acme"
    row = await (await db.execute("SELECT tenant FROM replay WHERE id = %s", (replay.id,))).fetchone()
    assert row == ("acme",)


async def test_an_unfinished_or_twice_listed_run_is_refused(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    done = await recorded(store, db, CALLS)
    running = await recorded(store, db, CALLS, status="RUNNING")
    with pytest.raises(Refused) as refused:
        await Door(store).replay(_replay(), [done, running], Caller())
    assert refused.value.kind is Refusal.CONFLICT and refused.value.problems[0].field == "runs[1]"
    with pytest.raises(Refused) as refused:
        await Door(store).replay(_replay(), [done, done], Caller())
    assert refused.value.problems[0].field == "runs[1]"


async def test_from_seq_keeps_the_recorded_steps_before_it(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    a = await recorded(store, db, CALLS)  # 5 steps: MODEL TOOL MODEL TOOL MODEL
    replay = _replay(from_seq=3)
    await Door(store).replay(replay, [a], Caller())
    (run,) = [r for r in await store.list_runs() if r.replay_id == replay.id]
    assert (run.parent_run_id, run.forked_at_seq, run.inherited_steps, run.steps) == (a.id, 2, 2, 2)
    steps = await store.steps(run.id)
    assert [(s.kind, s.inherited) for s in steps] == [(StepKind.MODEL, True), (StepKind.TOOL, True)]
    assert (await (await db.execute("SELECT from_seq FROM replay WHERE id = %s", (replay.id,))).fetchone()) == (3,)

    for bad in (1, 7):
        with pytest.raises(Refused) as refused:
            await Door(store).replay(_replay(from_seq=bad), [a], Caller())
        assert [p.field for p in refused.value.problems] == ["fromSeq"]
        assert "between 2 and 6" in refused.value.message
    last = _replay(from_seq=6)  # every step kept: the model is asked again after the recorded answer
    await Door(store).replay(last, [a], Caller())


async def test_a_continuation_is_replayed_from_the_conversation_it_started_with(
    store: RunStore, db: psycopg.AsyncConnection[Any],
) -> None:
    first = await recorded(store, db, CALLS[:1])  # 3 steps
    submitted = await Door(store).submit(RunSpec(input="and now?", continue_from=first.id), Origin.API, source=first)
    cont = submitted.run  # its opening (the first input) and 3 steps inherited, its own USER step 5th
    await db.execute("UPDATE run SET status = 'SUCCEEDED', finished_at = now() WHERE id = %s", (cont.id,))
    cont = await store.get(cont.id)
    assert cont is not None and cont.inherited_steps == 4 and cont.steps == 5
    replay = _replay(change=Change(model="claude-haiku-4-5"))
    await Door(store).replay(replay, [cont], Caller())
    (run,) = [r for r in await store.list_runs() if r.replay_id == replay.id]
    assert (run.parent_run_id, run.forked_at_seq, run.steps, run.model) == (cont.id, 5, 5, "claude-haiku-4-5")
    steps = await store.steps(run.id)
    assert steps[-1].kind is StepKind.USER and steps[-1].response == "and now?"


async def test_an_agent_change_applies_the_agents_fields_even_to_a_fork(
    store: RunStore, db: psycopg.AsyncConnection[Any],
) -> None:
    from agentrun.worker.core.agents import Agent

    await store.put_agent(Agent(name="helper", version=1, model="claude-opus-4-1", system="be kind"))
    a = await recorded(store, db, CALLS)
    replay = _replay(change=Change(agent="helper@1"), from_seq=3)
    await Door(store).replay(replay, [a], Caller())
    (run,) = [r for r in await store.list_runs() if r.replay_id == replay.id]
    assert (run.model, run.system, run.agent, run.agent_version) == ("claude-opus-4-1", "be kind", "helper", 1)
    with pytest.raises(Refused) as refused:
        await Door(store).replay(_replay(change=Change(agent="nobody")), [a], Caller())
    assert refused.value.kind is Refusal.NOT_FOUND and [p.field for p in refused.value.problems] == ["change.agent"]
    with pytest.raises(Refused) as refused:
        await Door(store).replay(_replay(change=Change(agent="bad@@")), [a], Caller())
    assert [p.field for p in refused.value.problems] == ["change.agent"]
