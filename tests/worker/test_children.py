"""Sub-agents as durable child runs, driven by real workers over real PostgreSQL: parallel children, a
parent that holds no lease while they work, crashes of the parent's driver at each point of the call,
budgets carved out of the parent's remainder, limits, failures and cancels that cascade."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from decimal import Decimal
from typing import Any

import pytest

from agentrun.worker.core.records import Decision, DecisionKind, RunStatus, StepKind, StepStatus
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import TreeLlm
from tests.support.builders import SimulatedCrash, new_run, worker
from tests.support.running import finished, running
from tests.support.trees import define, planner
from tests.support.waiting import eventually


async def tool_results(store: RunStore, run_id: uuid.UUID) -> dict[str, tuple[StepStatus, str | None]]:
    return {s.tool_use_id or "": (s.status, s.response) for s in await store.steps(run_id) if s.kind is StepKind.TOOL}


async def test_a_planner_with_two_sub_agents_called_in_parallel_finishes_with_both_answers(store: RunStore) -> None:
    parent = await planner(store, "researcher", "writer")
    llm = TreeLlm()
    async with running(worker(store, llm, concurrency=4)):
        done = await finished(store, parent.id, 60)
    assert done.status is RunStatus.SUCCEEDED, done.error
    assert done.output == ("combined: researcher: part 1 of: the question | writer: part 2 of: the question")
    children = await store.children(parent.id)
    assert [(c.agent, c.agent_version, c.parent_tool_use_id, c.status) for c in children] == [
        ("researcher", 1, "toolu_0_agent__researcher", RunStatus.SUCCEEDED),
        ("writer", 1, "toolu_1_agent__writer", RunStatus.SUCCEEDED),
    ]
    assert all(c.parent_run_id == parent.id and c.root_run_id == parent.id and c.depth == 1 for c in children)
    assert all(c.input.startswith("part ") and c.system in ("researcher", "writer") for c in children)
    # Both were at work together: the parent's one turn asked for both, and waited for both.
    first_turn = [r for r in llm.seen if r.system == "planner"][0]
    assert {t["name"] for t in first_turn.tools} >= {"agent__researcher", "agent__writer"}
    # Its own tokens, and the totals with its children's.
    assert (done.tokens_used, done.children_tokens, done.tokens_used_total) == (30, 30, 60)


class CrashOnSpawn(RunStore):
    """The parent's worker dies at the sub-agent call: before the write that makes the children, or after
    it committed and before its answer came back."""

    def __init__(self, store: RunStore, after: bool) -> None:
        super().__init__(store.pool)
        self.after, self.crashed = after, False

    async def spawn(self, run_id: uuid.UUID, worker: str, children: Any, **kw: Any) -> bool:
        if self.crashed:
            return await super().spawn(run_id, worker, children, **kw)
        self.crashed = True
        if self.after:
            await super().spawn(run_id, worker, children, **kw)
        raise SimulatedCrash


@pytest.mark.parametrize("after", [False, True], ids=["before-the-write", "after-the-write"])
async def test_a_crash_of_the_parents_worker_at_the_call_starts_no_second_child(store: RunStore, after: bool) -> None:
    parent = await planner(store, "researcher", "writer")
    crashing = worker(CrashOnSpawn(store, after), TreeLlm(), name="worker-A", lease=3.0, liveness_lock=False)
    with pytest.raises(SimulatedCrash):
        await crashing.run_once()
    # worker-A is gone with the parent's lease (or the parent parked, if the write got through).
    async with running(worker(store, TreeLlm(), name="worker-B", lease=3.0)):
        done = await finished(store, parent.id, 60)
    assert done.status is RunStatus.SUCCEEDED, done.error
    children = await store.children(parent.id)
    assert len(children) == 2 and all(c.status is RunStatus.SUCCEEDED for c in children)
    results = await tool_results(store, parent.id)
    assert sorted(results) == ["toolu_0_agent__researcher", "toolu_1_agent__writer"]


class CancelBeforeSpawn(RunStore):
    """Someone cancels the parent after its sub-agent turn's checkpoint, just before the spawn."""

    async def spawn(self, run_id: uuid.UUID, worker: str, children: Any, **kw: Any) -> bool:
        await self.cancel(run_id, by="alice")
        return await super().spawn(run_id, worker, children, **kw)


async def test_a_cancel_between_the_turn_and_the_spawn_starts_no_child(store: RunStore) -> None:
    parent = await planner(store, "researcher", "writer")
    llm = TreeLlm()
    async with running(worker(CancelBeforeSpawn(store.pool), llm)):
        done = await finished(store, parent.id, 60)
    assert (done.status, done.cancelled_by) == (RunStatus.CANCELLED, "alice")
    assert await store.children(parent.id) == []
    assert [r.system for r in llm.seen] == ["planner"]  # no child's model call was paid for


@pytest.mark.parametrize("names", [("*",), ("agent__researcher", "agent__writer")], ids=["star", "named"])
async def test_a_sub_agent_call_that_needs_approval_starts_no_child_until_approved(
    store: RunStore, names: tuple[str, ...],
) -> None:
    """`requireApproval: ["*"]` covers every call, a sub-agent's too; a sub-agent's tool can be named. No
    child (and none of its spending) before a person approves; a denied call is an error result."""
    parent = await planner(store, "researcher", "writer", require_approval=names)
    llm = TreeLlm()
    async with running(worker(store, llm, concurrency=3)):
        async def asked() -> bool:
            run = await store.get(parent.id)
            return run is not None and run.status is RunStatus.WAITING and run.pending == 2

        await eventually(asked, 60, "the parent to wait for two approvals")
        assert await store.children(parent.id) == []
        assert [r.system for r in llm.seen] == ["planner"]
        pending = await store.decisions(parent.id)
        assert sorted((p.tool_use_id, p.kind) for p in pending) == [
            ("toolu_0_agent__researcher", DecisionKind.APPROVAL), ("toolu_1_agent__writer", DecisionKind.APPROVAL)]
        await store.decide(parent.id, "toolu_0_agent__researcher", Decision.APPROVE, by="alice")
        await store.decide(parent.id, "toolu_1_agent__writer", Decision.DENY, reason="not today", by="alice")
        done = await finished(store, parent.id, 60)
    assert done.status is RunStatus.SUCCEEDED, done.error
    assert [(c.agent, c.status) for c in await store.children(parent.id)] == [("researcher", RunStatus.SUCCEEDED)], await tool_results(store, parent.id)
    results = await tool_results(store, parent.id)
    assert results["toolu_0_agent__researcher"][0] is StepStatus.DONE
    status, why = results["toolu_1_agent__writer"]
    assert status is StepStatus.ERROR and why is not None and "denied" in why and "not today" in why


async def test_a_child_runs_with_its_agents_context_policy(store: RunStore) -> None:
    """An agent's contextManagement is its runs', a sub-agent's run too: a child that works long enough to
    fill its window compacts as its agent says, instead of failing on a default it was never given."""
    policy = {"strategy": "clear_tool_results", "keepRecentTurns": 2, "triggerTokens": 5000}
    refs = (await define(store, "researcher", context_management=policy), await define(store, "writer"))
    parent, _ = await store.create(new_run("q", system="planner", sub_agents=refs))
    async with running(worker(store, TreeLlm(), concurrency=3)):
        done = await finished(store, parent.id, 60)
    assert done.status is RunStatus.SUCCEEDED, done.error
    by_agent = {c.agent: c for c in await store.children(parent.id)}
    assert by_agent["researcher"].context_management == policy
    assert by_agent["writer"].context_management is None  # its agent names none: the default


async def test_a_child_never_gets_more_than_what_the_parent_has_left(store: RunStore) -> None:
    """The parent's 100 tokens, 10 spent on its first turn: each of two children gets 45, though the
    agent would allow 1000; its deadline is within the parent's."""
    refs = (await define(store, "researcher", token_budget=1000), await define(store, "writer"))
    parent, _ = await store.create(new_run("q", system="planner", sub_agents=refs, token_budget=100,
                                           cost_budget_usd=Decimal("1.00"), timeout_seconds=120))
    async with running(worker(store, TreeLlm(in_=5, out=5))):
        done = await finished(store, parent.id, 60)
    children = await store.children(parent.id)
    assert [c.token_budget for c in children] == [45, 45]
    assert all(c.cost_budget_usd is not None and c.cost_budget_usd <= Decimal("0.5") for c in children)
    assert all(c.deadline_at <= parent.deadline_at for c in children)
    assert done.tokens_used_total <= 100


async def test_a_child_that_fails_is_an_error_result_naming_its_status(store: RunStore) -> None:
    ref = await define(store, "researcher", model="no-such-provider/model-x")
    parent, _ = await store.create(new_run("q", system="planner", sub_agents=(ref,)))

    class RefusingChild(TreeLlm):
        async def send(self, request: Any) -> Any:
            if request.system == "researcher":
                from agentrun.worker.core.types import LlmError

                raise LlmError(400, None, "model not found")
            return await super().send(request)

    async with running(worker(store, RefusingChild())):
        done = await finished(store, parent.id, 60)
    assert done.status is RunStatus.SUCCEEDED
    ((status, output),) = (await tool_results(store, parent.id)).values()
    assert status is StepStatus.ERROR and output is not None
    assert "sub-agent researcher" in output and "ended FAILED" in output and "model not found" in output
    assert done.output is not None and "ERROR" in str(done.output)


async def test_calls_past_the_per_turn_limit_and_the_depth_are_errors_the_model_sees(store: RunStore) -> None:
    parent = await planner(store, "researcher", "writer")
    w = worker(store, TreeLlm())
    w.driver.settings = dataclasses.replace(w.driver.settings, max_children_per_turn=1)
    async with running(w):
        done = await finished(store, parent.id, 60)
    assert done.status is RunStatus.SUCCEEDED
    results = await tool_results(store, parent.id)
    assert results["toolu_0_agent__researcher"][0] is StepStatus.DONE
    status, why = results["toolu_1_agent__writer"]
    assert status is StepStatus.ERROR and why is not None and "at most 1 sub-agent calls" in why
    assert len(await store.children(parent.id)) == 1

    deep = await planner(store, "researcher")
    async with store.pool.connection() as conn:
        await conn.execute("UPDATE run SET depth = 4 WHERE id = %s", (deep.id,))
    async with running(worker(store, TreeLlm())):
        done = await finished(store, deep.id, 60)
    ((status, why),) = (await tool_results(store, deep.id)).values()
    assert status is StepStatus.ERROR and why is not None and "nest at most 4 deep" in why
    assert await store.children(deep.id) == []


async def test_the_parent_holds_no_lease_and_a_cancel_cascades_to_its_children(store: RunStore) -> None:
    hold = asyncio.Event()
    parent = await planner(store, "researcher", "writer")
    async with running(worker(store, TreeLlm(hold=hold), concurrency=3)):
        async def children_at_work() -> bool:
            children = await store.children(parent.id)
            return len(children) == 2 and all(c.status is RunStatus.RUNNING for c in children)

        await eventually(children_at_work, 60, "both children running")
        waiting = await store.get(parent.id)
        assert waiting is not None
        assert (waiting.status, waiting.waiting_for, waiting.locked_by, waiting.pending) == (
            RunStatus.WAITING, "children", None, 2)
        await store.cancel(parent.id, by="alice")
        for child in await store.children(parent.id):
            ended = await finished(store, child.id, 60)
            assert ended.status is RunStatus.CANCELLED and ended.cancelled_by == "alice"
    done = await store.get(parent.id)
    assert done is not None and done.status is RunStatus.CANCELLED
    assert done.error == "cancelled while waiting for its sub-agents"


async def test_a_child_runs_out_of_time_before_its_parent_which_hears_of_it(store: RunStore) -> None:
    hold = asyncio.Event()  # the child never answers
    parent = await planner(store, "researcher", timeout_seconds=4)
    async with running(worker(store, TreeLlm(hold=hold), concurrency=3)):
        done = await finished(store, parent.id, 60)
    (child,) = await store.children(parent.id)
    assert child.status is RunStatus.TIMED_OUT and child.deadline_at <= done.deadline_at
    assert done.status is RunStatus.SUCCEEDED and "ERROR" in str(done.output) and "TIMED_OUT" in str(done.output)


async def test_a_parent_past_its_deadline_while_waiting_ends_and_its_children_are_cancelled(
    store: RunStore, db: Any
) -> None:
    hold = asyncio.Event()
    parent = await planner(store, "researcher")
    async with running(worker(store, TreeLlm(hold=hold), concurrency=3)):
        async def child_at_work() -> bool:
            children = await store.children(parent.id)
            return len(children) == 1 and children[0].status is RunStatus.RUNNING

        await eventually(child_at_work, 60, "the child running")
        await db.execute("UPDATE run SET deadline_at = now() WHERE id = %s", (parent.id,))  # its time is up
        done = await finished(store, parent.id, 60)
        (child,) = await store.children(parent.id)
        ended = await finished(store, child.id, 60)
    assert done.status is RunStatus.TIMED_OUT and done.error is not None and "its sub-agents" in done.error
    assert ended.status is RunStatus.CANCELLED


async def test_a_sub_agent_that_cannot_start_is_an_error_result_and_makes_no_child(store: RunStore) -> None:
    parent = await planner(store, "researcher")
    async with store.pool.connection() as conn:  # its agent names a tool no worker offers (edited in place)
        await conn.execute("UPDATE agent_version SET tools = ARRAY['no_such_tool'] WHERE name = 'researcher'")
    async with running(worker(store, TreeLlm())):
        done = await finished(store, parent.id, 60)
    ((status, why),) = (await tool_results(store, parent.id)).values()
    assert status is StepStatus.ERROR and why is not None
    assert "sub-agent researcher@1 cannot start" in why and "no_such_tool" in why
    assert await store.children(parent.id) == [] and done.status is RunStatus.SUCCEEDED
