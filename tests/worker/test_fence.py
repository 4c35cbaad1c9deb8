"""The lease epoch (a write of an earlier claim never lands) and writes sent again while their first copy
still executes (issue 24, items 3 and 6)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.core.records import DecisionKind, ModelTurn, Progress, RunStatus, StepKind
from agentrun.worker.core.types import LlmRequest, LlmResponse, Usage
from agentrun.worker.runtime.engine import DriverSettings, RunDriver
from agentrun.worker.runtime.lease import LeaseKeeper
from agentrun.worker.store import LeaseLost, RunStore
from agentrun.worker.store.groupcommit import GroupCommit, transient
from agentrun.worker.store.pool import open_pool
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolBox, ToolContext, tool
from tests.support.builders import new_run
from tests.support.waiting import eventually


class GatedLlm(ScriptedLlm):
    """Answers from its script once `gate` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def send(self, request: LlmRequest) -> LlmResponse:
        await self.gate.wait()
        return await super().send(request)


@contextlib.asynccontextmanager
async def row_locked(database_url: str, *run_ids: uuid.UUID) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """Hold the rows of `run_ids` locked (an open transaction) until the block ends."""
    conn = await psycopg.AsyncConnection.connect(database_url)
    try:
        await conn.execute("SELECT id FROM run WHERE id = ANY(%s) ORDER BY id FOR UPDATE", (list(run_ids),))
        yield conn
    finally:
        await conn.rollback()
        await conn.close()


async def lock_waiters(db: psycopg.AsyncConnection[Any]) -> int:
    cur = await db.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


def driver(store: RunStore, llm: ScriptedLlm, tools: ToolBox, me: str = "W") -> RunDriver:
    return RunDriver(DriverSettings(me), store, llm, tools, PriceTable.load(), LeaseKeeper(store, me, 30.0))


# -- 3. a lease epoch -----------------------------------------------------------------------------


async def test_a_write_left_by_a_cancelled_driver_never_lands_after_the_same_worker_claims_again(
    store: RunStore, db: psycopg.AsyncConnection[Any], database_url: str
) -> None:
    """Driver 1 of worker W has its checkpoint on the wire (in a batch held up behind another run's row)
    when it is given up; W claims the run again and driver 2 replays and writes the turn again. The
    first driver's checkpoint must not land: it would be a second model step for the same turn."""
    batched = RunStore(store.pool, GroupCommit(store.pool, senders=1))
    x, y, r = (await store.create(new_run()))[0], (await store.create(new_run()))[0], (await store.create(new_run()))[0]
    claims = {c.run.id: c for c in await store.claim_many("W", 30, limit=3)}
    assert set(claims) == {x.id, y.id, r.id}

    async def checkpoint(run_id: uuid.UUID) -> Any:
        return await batched.checkpoint_model(
            run_id, "W", 30, ModelTurn("{}", "[]", "end_turn", Usage(1, 1, 0, 0), None, 0),
        )

    old_llm = GatedLlm().then_tool_use("t1", "wait")
    stuck = asyncio.Event()

    @tool(name="wait")
    async def wait(args: dict[str, Any], ctx: ToolContext) -> str:
        stuck.set()
        await asyncio.Event().wait()
        return "never"

    first = driver(batched, old_llm, ToolBox([wait]))
    async with row_locked(database_url, x.id) as tx1, row_locked(database_url, y.id) as tx2:
        x_write = asyncio.create_task(checkpoint(x.id))  # the only sender waits on x's row
        await eventually(lambda: _at_least(lock_waiters(db), 1), what="x's write to wait for its row")
        # A write of another kind: y's and r's go as two statements, y's first, whatever the ids' order.
        y_write = asyncio.create_task(batched.add_user_step(y.id, "W", 30, text="hello"))
        old = asyncio.create_task(first.drive(claims[r.id].run, claims[r.id].progress, fresh=True))
        old_llm.gate.set()  # driver 1's turn comes back: its checkpoint queues behind y's write
        await eventually(lambda: _true(len(batched.writes._queue) == 2), what="y's and r's writes to queue")
        await tx1.rollback()  # x written; y's and r's writes leave as one batch, and y's waits for its row
        await x_write
        await eventually(lambda: _at_least(lock_waiters(db), 1), what="the batch to wait on y's row")
        first.keeper.give_up([r.id])  # driver 1 is given up with its checkpoint on the wire
        with pytest.raises(LeaseLost):
            await old
        # The lease lapses; W claims the run again and driver 2 replays it: the turn, then the tool.
        await db.execute("UPDATE run SET locked_until = now() - interval '1 second' WHERE id = %s", (r.id,))
        [again] = await store.claim_many("W", 30, limit=1)
        assert again.run.id == r.id
        second = driver(store, ScriptedLlm().then_tool_use("t1", "wait"), ToolBox([wait]))
        new = asyncio.create_task(second.drive(again.run, again.progress))
        await asyncio.wait_for(stuck.wait(), 10)
        await tx2.rollback()  # y written; then driver 1's checkpoint is executed
        await y_write
        await batched.writes.aclose()  # every write it was given has been sent (or skipped)
    try:
        kinds = [s.kind for s in await store.steps(r.id)]
        assert kinds == [StepKind.MODEL, StepKind.TOOL], f"the given-up driver's checkpoint landed: {kinds}"
        run = await store.get(r.id)
        assert run is not None and run.tokens_used == 0
    finally:
        new.cancel()
        await asyncio.gather(new, return_exceptions=True)


async def _true(value: bool) -> bool:
    return value


async def _at_least(n: Awaitable[int], least: int) -> bool:
    return await n >= least


# -- 6. a write sent again while its first copy still executes --------------------------------------

Write = Callable[[RunStore, uuid.UUID, int, uuid.UUID, bool], Awaitable[Any]]

WRITES: dict[str, Write] = {
    "checkpoint": lambda s, run_id, epoch, wid, again: s.checkpoint_model(
        run_id, "W", 30, write_id=wid, epoch=epoch, again=again, turn=ModelTurn("{}", "[]", "end_turn", Usage(10, 5, 0, 0), None, 0)),
    "start_tool": lambda s, run_id, epoch, wid, again: s.start_tool(
        run_id, "W", 30, write_id=wid, epoch=epoch, again=again, tool_use_id="t1", tool_name="pay", request="{}"),
    "finish_tool": lambda s, run_id, epoch, wid, again: s.finish_tool(
        run_id, "W", 30, write_id=wid, epoch=epoch, again=again, tool_use_id="t1", ok=True, output="paid",
        latency_ms=3),
    "settle_tool": lambda s, run_id, epoch, wid, again: s.settle_tool(
        run_id, "W", 30, write_id=wid, epoch=epoch, again=again, tool_use_id="t2", tool_name="pay", request="{}",
        ok=False, output="denied"),
    "add_user_step": lambda s, run_id, epoch, wid, again: s.add_user_step(
        run_id, "W", 30, write_id=wid, epoch=epoch, again=again, text="answer again"),
    "release": lambda s, run_id, epoch, wid, again: s.release(run_id, "W", delay=60, epoch=epoch, again=again),
    "park": lambda s, run_id, epoch, wid, again: s.park(
        run_id, "W", [("t1", DecisionKind.IN_DOUBT, "pay", "{}", 1)], epoch=epoch, again=again),
    "finish": lambda s, run_id, epoch, wid, again: s.finish(
        run_id, "W", RunStatus.SUCCEEDED, None, epoch=epoch, again=again),
}

# What the run looks like after both copies: (steps, most attempts, tokens, status, model_retries, decisions)
AFTER: dict[str, tuple[int, int | None, int, str, int, int]] = {
    "checkpoint": (1, 1, 15, "RUNNING", 0, 0),
    "start_tool": (1, 1, 0, "RUNNING", 0, 0),
    "finish_tool": (1, 1, 0, "RUNNING", 0, 0),
    "settle_tool": (2, 1, 0, "RUNNING", 0, 0),
    "add_user_step": (1, 1, 0, "RUNNING", 0, 0),
    "release": (0, None, 0, "QUEUED", 1, 0),
    "park": (1, 1, 0, "WAITING", 0, 1),
    "finish": (0, None, 0, "SUCCEEDED", 0, 0),
}


def _answer(result: Any) -> Any:
    """What a write answered, without the lease's progress (its `db_now` differs between the copies)."""
    if isinstance(result, tuple):
        return result[:-1]
    return None if isinstance(result, Progress) else result


@pytest.mark.parametrize("kind", list(WRITES))
async def test_a_write_sent_again_while_its_first_copy_waits_for_the_run_is_applied_once(
    kind: str, store: RunStore, db: psycopg.AsyncConnection[Any], database_url: str
) -> None:
    """The first copy waits for the run row (here a test transaction holds it); the client, having lost
    its connection, sends the same write again, on another connection, and it waits too. Once the row
    is free both answer the same, and the run shows the write once."""
    await store.create(new_run())
    claim = await store.claim("W", 30)
    assert claim is not None
    run_id, epoch = claim.run.id, claim.run.lease_epoch
    if kind in ("finish_tool", "park", "settle_tool"):  # a call started before: t1 STARTED
        await store.start_tool(run_id, "W", 30, epoch=epoch, tool_use_id="t1", tool_name="pay", request="{}")
    write, wid = WRITES[kind], uuid.uuid4()
    first_store, again_store = RunStore(store.pool), RunStore(store.pool)
    async with row_locked(database_url, run_id) as holder:
        first = asyncio.create_task(write(first_store, run_id, epoch, wid, False))
        await eventually(lambda: _at_least(lock_waiters(db), 1), what="the first copy to wait for the run")
        again = asyncio.create_task(write(again_store, run_id, epoch, wid, True))
        await eventually(lambda: _at_least(lock_waiters(db), 2), what="the copy sent again to wait too")
        await holder.rollback()
        answers = await asyncio.gather(first, again)
    assert _answer(answers[0]) == _answer(answers[1])
    cur = await db.execute(
        """SELECT (SELECT count(*) FROM run_step WHERE run_id = r.id), (SELECT max(attempts) FROM run_step
                   WHERE run_id = r.id), r.tokens_used, r.status, r.model_retries,
                  (SELECT count(*) FROM run_decision WHERE run_id = r.id)
           FROM run r WHERE r.id = %s""",
        (run_id,),
    )
    assert await cur.fetchone() == AFTER[kind]
    after = await store.get(run_id)
    assert after is not None and after.crashes == 0


async def test_every_write_of_an_earlier_claim_is_refused_and_changes_nothing(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    """Two claims of one run by the same worker: each has an epoch of its own, and the first one's
    writes (a step, a renewal, a handback, a park, the end) are refused with LeaseLost."""
    await store.create(new_run())
    first = await store.claim("W", 30)
    assert first is not None
    await db.execute("UPDATE run SET locked_until = now() - interval '1 second' WHERE id = %s", (first.run.id,))
    second = await store.claim("W", 30)
    assert second is not None and second.run.id == first.run.id
    run_id, old = first.run.id, first.run.lease_epoch
    assert second.run.lease_epoch == old + 1
    before = await db.execute("SELECT row_to_json(r)::text FROM run r WHERE id = %s", (run_id,))
    snapshot = await before.fetchone()
    for kind in ("checkpoint", "start_tool", "add_user_step", "park", "finish"):
        with pytest.raises(LeaseLost):
            await WRITES[kind](store, run_id, old, uuid.uuid4(), False)
    assert not await store.release(run_id, "W", epoch=old)
    assert await store.renew([run_id], "W", 30, {run_id: old}) == {}
    after = await db.execute("SELECT row_to_json(r)::text FROM run r WHERE id = %s", (run_id,))
    assert await after.fetchone() == snapshot and await store.steps(run_id) == []
    assert set(await store.renew([run_id], "W", 30, {run_id: second.run.lease_epoch})) == {run_id}


@pytest.mark.parametrize("kind", ["checkpoint", "start_tool", "finish_tool"])
async def test_an_earlier_claims_write_is_refused_in_a_batch_too(
    store: RunStore, db: psycopg.AsyncConnection[Any], kind: str
) -> None:
    """The writes every step makes share one statement per kind across runs (group commit): that statement
    fences each run on its own claim's epoch too, not on the worker's name alone."""
    for _ in range(3):
        await store.create(new_run())
    claims = await store.claim_many("W", 30, limit=3)
    (run_id, old), *others = [(c.run.id, c.run.lease_epoch) for c in claims]
    await db.execute("UPDATE run SET locked_until = now() - interval '1 second' WHERE id = %s", (run_id,))
    again = await store.claim("W", 30)  # the same worker claims it again: a new epoch
    assert again is not None and again.run.id == run_id and again.run.lease_epoch == old + 1
    if kind == "finish_tool":  # a call started under each run's current claim
        for i, e in [(run_id, old + 1), *others]:
            await WRITES["start_tool"](store, i, e, uuid.uuid4(), False)
    before = await db.execute("SELECT row_to_json(r)::text FROM run r WHERE id = %s", (run_id,))
    snapshot = await before.fetchone()
    steps = await store.steps(run_id)
    batched = RunStore(store.pool, GroupCommit(store.pool, senders=1))
    answers = await asyncio.gather(WRITES[kind](batched, run_id, old, uuid.uuid4(), False),
                                   *(WRITES[kind](batched, i, e, uuid.uuid4(), False) for i, e in others),
                                   return_exceptions=True)
    assert batched.writes.stats.largest == 3  # one shared statement
    assert isinstance(answers[0], LeaseLost) and not any(isinstance(a, BaseException) for a in answers[1:]), answers
    after = await db.execute("SELECT row_to_json(r)::text FROM run r WHERE id = %s", (run_id,))
    assert await after.fetchone() == snapshot and await store.steps(run_id) == steps


async def test_a_copy_sent_again_in_a_batch_finds_its_first_copy_through_the_shared_statement(
    store: RunStore, db: psycopg.AsyncConnection[Any], database_url: str
) -> None:
    """The same overlap, the copy going with two other runs' checkpoints as one shared statement."""
    for _ in range(3):
        await store.create(new_run())
    claims = await store.claim_many("W", 30, limit=3)
    (run_id, epoch), *others = [(c.run.id, c.run.lease_epoch) for c in claims]
    batched = RunStore(store.pool, GroupCommit(store.pool, senders=1))
    wid, checkpoint = uuid.uuid4(), WRITES["checkpoint"]
    async with row_locked(database_url, run_id) as holder:
        first = asyncio.create_task(checkpoint(RunStore(store.pool), run_id, epoch, wid, False))
        await eventually(lambda: _at_least(lock_waiters(db), 1), what="the first copy to wait for the run")
        together = asyncio.gather(checkpoint(batched, run_id, epoch, wid, True),
                                  *(checkpoint(batched, i, e, uuid.uuid4(), False) for i, e in others))
        await eventually(lambda: _at_least(lock_waiters(db), 2), what="the batch to wait too")
        await holder.rollback()
        answers = [await first, *await together]
    assert batched.writes.stats.largest == 3 and batched.writes.stats.split == 0
    assert [seq for seq, _ in answers] == [1, 1, 1, 1]
    cur = await db.execute("SELECT run_id, count(*) FROM run_step GROUP BY run_id")
    assert sorted(n for _, n in await cur.fetchall()) == [1, 1, 1]
    cur = await db.execute("SELECT tokens_used FROM run WHERE id = %s", (run_id,))
    assert await cur.fetchone() == (15,)


@pytest.mark.parametrize("error, retried", [
    (psycopg.errors.QueryCanceled, True),  # 57014: statement_timeout
    (psycopg.errors.LockNotAvailable, True),  # 55P03: lock_timeout
    (psycopg.errors.SerializationFailure, True),  # 40001
    (psycopg.errors.DeadlockDetected, True),  # 40P01
    (psycopg.errors.UniqueViolation, False),
    (psycopg.errors.NumericValueOutOfRange, False),
])
def test_timeouts_serialization_failures_and_deadlocks_are_sent_again(error: type[psycopg.Error], retried: bool) -> None:
    assert transient(error("refused")) is retried


async def test_a_write_that_hits_its_lock_timeout_is_sent_again_and_lands_once(
    store: RunStore, db: psycopg.AsyncConnection[Any], database_url: str
) -> None:
    """A write refused by lock_timeout (the run row held for longer) goes again through the engine's
    resend loop and lands once, instead of failing the run."""
    await store.create(new_run())
    claim = await store.claim("W", 30)
    assert claim is not None
    run_id, epoch, wid = claim.run.id, claim.run.lease_epoch, uuid.uuid4()
    d = driver(store, ScriptedLlm(), ToolBox([]))
    sent: list[bool] = []

    impatient = await open_pool(make_conninfo(database_url, options="-c lock_timeout=100ms"), max_size=2)
    try:
        writes = RunStore(impatient)

        async def checkpoint(again: bool) -> Any:
            sent.append(again)
            return await WRITES["checkpoint"](writes, run_id, epoch, wid, again)

        async with row_locked(database_url, run_id) as holder:
            write = asyncio.create_task(d.durable.write(checkpoint))
            await eventually(lambda: _true(len(sent) >= 2), what="the write to be refused and sent again")
            await holder.rollback()
            seq, progress = await write
    finally:
        await impatient.close()
    assert sent[:2] == [False, True]
    assert seq == 1 and progress.tokens_used == 15 and len(await store.steps(run_id)) == 1
