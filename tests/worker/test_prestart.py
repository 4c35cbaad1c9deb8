"""A model turn's calls STARTED by its own checkpoint (runtime/people.py `unasked`, store `checkpoint_turn`): one write
less per call, and the same step log, crash and cancel behaviour as a STARTED row of its own."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from agentrun.worker.core.records import ModelTurn, RunStatus, StepStatus, Usage
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolContext, tool
from tests.support.builders import SimulatedCrash, new_run, worker


async def expire_lease(db: psycopg.AsyncConnection[Any], run_id: uuid.UUID) -> None:
    await db.execute("UPDATE run SET locked_until = now() - interval '1 second' WHERE id = %s", (run_id,))


class Counting(RunStore):
    """The real store, counting its fenced writes by kind."""

    def __init__(self, pool: Any) -> None:
        super().__init__(pool)
        self.calls: list[str] = []
        self.started: list[int] = []

    async def checkpoint_turn(self, *a: Any, **kw: Any) -> Any:
        done = await super().checkpoint_turn(*a, **kw)
        self.calls.append("checkpoint")
        self.started.append(done[2])
        return done

    async def start_tool(self, *a: Any, **kw: Any) -> Any:
        self.calls.append("start_tool")
        return await super().start_tool(*a, **kw)


@tool(name="lookup", description="Looks a thing up; safe to repeat.")
async def lookup(args: dict[str, Any], ctx: ToolContext) -> str:
    return f"found {args.get('q')}"


@tool(name="pay", description="Pays; cannot honour an idempotency key.", idempotent=False)
async def pay(args: dict[str, Any], ctx: ToolContext) -> str:
    return "paid"


async def test_an_idempotent_call_is_started_by_the_checkpoint_of_its_turn(store: RunStore) -> None:
    counting = Counting(store.pool)
    llm = (ScriptedLlm().then_tool_uses([("a", "lookup", {"q": 1}), ("b", "lookup", {"q": 2})])
           .then_tool_use("c", "lookup", {"q": 3}).then_text("done"))
    run, _ = await store.create(new_run())
    assert await worker(counting, llm, [lookup]).run_once() == run.id
    assert counting.calls == ["checkpoint"] * 3  # no STARTED write of its own for any of the three calls
    assert counting.started == [2, 1, 0]
    steps = await store.timeline(run.id)
    assert [(s.seq, s.kind.value, s.tool_use_id, s.status.value, s.attempts) for s in steps] == [
        (1, "MODEL", None, "DONE", 1), (2, "TOOL", "a", "DONE", 1), (3, "TOOL", "b", "DONE", 1),
        (4, "MODEL", None, "DONE", 1), (5, "TOOL", "c", "DONE", 1), (6, "MODEL", None, "DONE", 1),
    ]
    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.SUCCEEDED
    assert llm.seen[1].messages[-1] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "a", "content": "found 1"},
        {"type": "tool_result", "tool_use_id": "b", "content": "found 2"},
    ]}


@pytest.mark.parametrize("why", ["not idempotent", "needs approval", "unknown tool", "step cap"])
async def test_a_turn_with_a_call_that_needs_more_than_running_starts_each_call_itself(
    store: RunStore, why: str
) -> None:
    """All or none: one call of the turn that is not plain (a person may be asked, it may not run at all,
    the cap may stop the turn) and every call of it gets its STARTED row from its own write, as before."""
    counting = Counting(store.pool)
    second = {"not idempotent": "pay", "needs approval": "lookup", "unknown tool": "nosuch"}.get(why, "lookup")
    llm = ScriptedLlm().then_tool_uses([("a", "lookup", {}), ("b", second, {})]).then_text("done")
    fields: dict[str, Any] = {}
    if why == "needs approval":
        fields["require_approval"] = ("lookup",)
    if why == "step cap":
        fields["max_steps"] = 2  # the model step and one call: the turn's two calls go past it
    run, _ = await store.create(new_run(**fields))
    await worker(counting, llm, [lookup, pay]).run_once()
    assert counting.started[0] == 0
    if why in ("not idempotent", "unknown tool"):
        assert counting.calls == ["checkpoint", "start_tool", "start_tool", "checkpoint"]


async def test_a_crash_after_the_checkpoint_runs_the_started_call_on_resume(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    """The checkpoint STARTED the call, the worker died before it ran: the call is owed, STARTED, and the
    next worker runs it (its second attempt), as after a crash right after a STARTED write of its own."""

    class DiesAfterCheckpoint(RunStore):
        died = False

        async def checkpoint_turn(self, *a: Any, **kw: Any) -> Any:
            done = await super().checkpoint_turn(*a, **kw)
            if done[2] and not self.died:
                self.died = True
                raise SimulatedCrash()
            return done

    ran: list[str] = []

    @tool(name="lookup")
    async def counted(args: dict[str, Any], ctx: ToolContext) -> str:
        ran.append(ctx.tool_use_id)
        return "found"

    llm = ScriptedLlm().then_tool_use("a", "lookup", {}).then_text("done")
    run, _ = await store.create(new_run())
    with pytest.raises(SimulatedCrash):
        await worker(DiesAfterCheckpoint(store.pool), llm, [counted], "worker-A").run_once()
    steps = await store.timeline(run.id)
    assert [(s.kind.value, s.status.value, s.attempts) for s in steps] == [("MODEL", "DONE", 1), ("TOOL", "STARTED", 1)]
    assert ran == []
    await expire_lease(db, run.id)
    assert await worker(store, llm, [counted], "worker-B").run_once() == run.id
    assert ran == ["a"]
    assert len(llm.seen) == 2  # the model turn was not asked again
    steps = await store.timeline(run.id)
    assert [(s.kind.value, s.status.value, s.attempts) for s in steps] == [
        ("MODEL", "DONE", 1), ("TOOL", "DONE", 2), ("MODEL", "DONE", 1)]
    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.SUCCEEDED


async def test_a_cancel_committed_before_the_checkpoint_starts_no_call(store: RunStore) -> None:
    """The cancel is read under the run's lock by the statement that would start the calls: none is STARTED,
    and the run ends CANCELLED without running it."""
    turn = ModelTurn("{}", '[{"type": "tool_use", "id": "a", "name": "lookup", "input": {}}]', "tool_use",
                     Usage(1, 1), None, 0)
    run, _ = await store.create(new_run())
    claimed = await store.claim("w", 30)
    assert claimed is not None
    await store.cancel(run.id, by="someone")
    seq, progress, started = await store.checkpoint_turn(
        run.id, "w", 30, turn, epoch=claimed.run.lease_epoch, tool_starts=[("a", "lookup", "{}")])
    assert (seq, started, progress.cancel_requested) == (1, 0, True)
    steps = await store.timeline(run.id)
    assert [(s.kind.value, s.status.value) for s in steps] == [("MODEL", "DONE")]


async def test_a_checkpoint_sent_again_finds_the_calls_its_first_copy_started(store: RunStore) -> None:
    turn = ModelTurn("{}", "[]", "tool_use", Usage(1, 1), None, 0)
    run, _ = await store.create(new_run())
    claimed = await store.claim("w", 30)
    assert claimed is not None
    wid = uuid.uuid4()
    starts = [("a", "lookup", '{"q": 1}'), ("b", "lookup", '{"q": 2}')]
    first = await store.checkpoint_turn(run.id, "w", 30, turn, write_id=wid, epoch=claimed.run.lease_epoch,
                                        tool_starts=starts)
    again = await store.checkpoint_turn(run.id, "w", 30, turn, write_id=wid, epoch=claimed.run.lease_epoch,
                                        tool_starts=starts, again=True)
    assert (first[0], first[2]) == (again[0], again[2]) == (1, 2)
    steps = await store.timeline(run.id)
    assert [(s.seq, s.tool_use_id, s.status) for s in steps] == [
        (1, None, StepStatus.DONE), (2, "a", StepStatus.STARTED), (3, "b", StepStatus.STARTED)]
    assert [s.request for s in (await store.steps(run.id))[1:]] == ['{"q": 1}', '{"q": 2}']
    after = await store.get(run.id)
    assert after is not None and after.tokens_used == 2  # counted once
