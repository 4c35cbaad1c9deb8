"""Group commit: the fenced writes of many runs in one transaction, each still fenced on its own."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest

from agentrun.worker.core.records import ModelTurn, RunStatus, StepKind
from agentrun.worker.core.types import Usage
from agentrun.worker.store import LeaseLost, RunStore, groupcommit
from agentrun.worker.store.groupcommit import GroupCommit
from agentrun.worker.testing.scripted import TurnBasedLlm
from agentrun.worker.tools import ToolContext, tool
from tests.support.builders import new_run, worker
from tests.support.running import running as serving
from tests.support.waiting import eventually


def _checkpoint(store: RunStore, run_id: uuid.UUID, worker: str, input_tokens: int = 10) -> Any:
    return store.checkpoint_model(
        run_id, worker, 30, ModelTurn("{}", '[{"type":"text","text":"x"}]', "end_turn", Usage(input_tokens, 5, 0, 0), None, 0),
    )


async def _held(store: RunStore, n: int, worker: str = "w") -> list[uuid.UUID]:
    for _ in range(n):
        await store.create(new_run())
    claims = await store.claim_many(worker, 30, limit=n)
    assert len(claims) == n
    return [c.run.id for c in claims]


async def test_writes_that_queue_together_share_one_transaction(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    batched = RunStore(store.pool, GroupCommit(store.pool, senders=1))
    ids = await _held(batched, 12)
    results = await asyncio.gather(*(_checkpoint(batched, run_id, "w") for run_id in ids))
    assert [seq for seq, _ in results] == [1] * 12
    assert all(progress.tokens_used == 15 for _, progress in results)
    # All twelve queued before the sender ran: they went together, in one transaction.
    assert (batched.writes.stats.batches, batched.writes.stats.largest) == (1, 12)
    cur = await db.execute("SELECT count(DISTINCT xmin::text) FROM run_step")
    assert await cur.fetchone() == (1,)


async def test_a_lone_write_is_sent_at_once_on_its_own(store: RunStore) -> None:
    [run_id] = await _held(store, 1)
    await _checkpoint(store, run_id, "w")
    assert (store.writes.stats.batches, store.writes.stats.largest) == (1, 1)


async def test_a_lost_lease_fails_only_its_own_write_in_a_batch(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    batched = RunStore(store.pool, GroupCommit(store.pool, senders=1))
    ids = await _held(batched, 6)
    stolen = ids[3]
    await db.execute("UPDATE run SET locked_by = 'thief' WHERE id = %s", (stolen,))
    results = await asyncio.gather(*(_checkpoint(batched, run_id, "w") for run_id in ids), return_exceptions=True)
    assert [isinstance(r, LeaseLost) for r in results] == [i == 3 for i in range(6)]
    assert batched.writes.stats.largest == 6
    cur = await db.execute("SELECT run_id FROM run_step")
    assert {row[0] for row in await cur.fetchall()} == set(ids) - {stolen}


async def test_a_refused_write_fails_alone_and_the_rest_of_its_batch_is_written(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    batched = RunStore(store.pool, GroupCommit(store.pool, senders=1))
    ids = await _held(batched, 5)
    # An INT column cannot take 2^40: the whole transaction is refused, then each write is sent alone.
    results = await asyncio.gather(
        *(_checkpoint(batched, run_id, "w", input_tokens=2**40 if i == 2 else 10) for i, run_id in enumerate(ids)),
        return_exceptions=True,
    )
    assert isinstance(results[2], psycopg.errors.NumericValueOutOfRange)
    assert all(not isinstance(r, BaseException) for i, r in enumerate(results) if i != 2)
    assert batched.writes.stats.split == 1
    cur = await db.execute("SELECT count(*) FROM run_step")
    assert await cur.fetchone() == (4,)


async def test_renewals_and_batched_writes_never_wait_on_each_other_in_a_circle(store: RunStore) -> None:
    """A renewal locks every held run; a batch locks its runs one statement at a time. The renewal skips
    the runs a batch has locked (that batch renews them), so neither waits on the other in a circle
    (PostgreSQL would abort one as a deadlock), and no held run is reported lost for being busy."""
    batched = RunStore(store.pool, GroupCommit(store.pool, senders=2, max_batch=8))
    ids = await _held(batched, 16)
    for _ in range(10):
        renewals = [batched.renew(list(reversed(ids)), "w", 30) for _ in range(2)]
        writes = [_checkpoint(batched, run_id, "w") for run_id in reversed(ids)]
        outcomes = await asyncio.gather(*renewals, *writes, return_exceptions=True)
        for outcome in outcomes:
            assert not isinstance(outcome, BaseException), outcome
        assert all(set(held) == set(ids) for held in outcomes[:2])


async def test_a_writer_that_stops_waiting_before_its_batch_leaves_sends_nothing(store: RunStore) -> None:
    batched = RunStore(store.pool, GroupCommit(store.pool, senders=1))
    first, second = await _held(batched, 2)
    sending = asyncio.ensure_future(_checkpoint(batched, first, "w"))  # leaves alone, at once
    waiting = asyncio.ensure_future(_checkpoint(batched, second, "w"))  # queues behind it
    await asyncio.sleep(0)
    waiting.cancel()
    await sending
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await batched.writes.aclose()
    assert batched.writes.stats.writes == 1
    assert await batched.steps(second) == []


async def test_many_runs_in_flight_survive_connection_cuts_on_the_batched_path(
    store: RunStore, db: psycopg.AsyncConnection[Any], database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twenty runs write together while every connection is cut, three times, each cut landing while a
    batch of several writes is on the server (held there by row locks on its runs, taken as it leaves):
    each tool call runs once (a batch lost with its connection is sent again and found by its write
    ids), every run succeeds, and each model step's tokens are counted once."""
    executions: dict[str, int] = {}
    armed = asyncio.Event()  # the next batch of several writes is to be held on the server
    held = asyncio.Event()  # ...and now is: its runs' rows are locked and it is being sent
    lost: list[int] = []  # the sizes of the batches whose connection broke under them
    real_together = groupcommit.commit_together
    locker = await psycopg.AsyncConnection.connect(database_url)

    async def watched(conn: psycopg.AsyncConnection[Any], batch: list[Any]) -> Any:
        if armed.is_set() and len(batch) > 1:
            armed.clear()
            await locker.execute("SELECT id FROM run WHERE id = ANY(%s) FOR UPDATE", ([w.run_id for w in batch],))
            held.set()
        try:
            return await real_together(conn, batch)
        except psycopg.OperationalError:
            lost.append(len(batch))
            raise

    monkeypatch.setattr(groupcommit, "commit_together", watched)

    @tool(name="noop", idempotent=False)
    async def noop(args: dict[str, Any], ctx: ToolContext) -> str:
        executions[ctx.tool_use_id + str(ctx.run_id)] = executions.get(ctx.tool_use_id + str(ctx.run_id), 0) + 1
        return "ok"

    async def a_batch_waits_on_the_server() -> bool:
        cur = await db.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND state = 'active'")
        return held.is_set() and int((await cur.fetchone())[0]) > 0  # type: ignore[index]

    runs = [(await store.create(new_run()))[0].id for _ in range(20)]
    w = worker(store, TurnBasedLlm(3), [noop], concurrency=20)
    async with serving(w), locker:
        for cut in range(3):
            held.clear()
            armed.set()
            await eventually(a_batch_waits_on_the_server, 60, f"a batch of several writes held (cut {cut + 1})")
            before = len(lost)
            await db.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid NOT IN (pg_backend_pid(), %s)", (locker.info.backend_pid,))
            await locker.rollback()
            await eventually(lambda before=before: _true(any(n > 1 for n in lost[before:])), 30,
                             f"the held batch to fail with its connection (cut {cut + 1})")

        async def all_finished() -> bool:
            return all(r is not None and r.status.terminal for r in await store.get_many(runs))

        await eventually(all_finished, 120, "every run to finish")
    after = await store.get_many(runs)
    assert {r.status for r in after} == {RunStatus.SUCCEEDED}, [r.error for r in after]
    assert len(executions) == 20 * 3 and set(executions.values()) == {1}
    cur = await db.execute("SELECT count(*), sum(input_tokens + output_tokens) FROM run_step WHERE kind = 'MODEL'")
    model_steps, tokens = await cur.fetchone()  # type: ignore[misc]
    assert model_steps == 20 * 4
    assert sum(r.tokens_used for r in after) == tokens
    assert max(lost) > 1  # a cut hit a batch of several writes in flight, not only lone writes or idle ones


async def _true(value: bool) -> bool:
    return value


async def test_shared_writes_sent_again_find_their_first_copy(store: RunStore) -> None:
    """The shared statements keep the write ids' promise: a copy sent again (its first answer lost, so sent
    with `again`, as runtime/durable.py sends it) appends nothing, counts no tokens and no attempt twice."""
    batched = RunStore(store.pool, GroupCommit(store.pool, senders=1))
    ids = await _held(batched, 3)
    wids = {run_id: uuid.uuid4() for run_id in ids}

    async def checkpoints(again: bool = False) -> list[Any]:
        return await asyncio.gather(*(batched.checkpoint_model(
            run_id, "w", 30, ModelTurn("{}", '[{"type":"text","text":"x"}]', "tool_use", Usage(10, 5, 0, 0), None, 3),
            write_id=wids[run_id], again=again) for run_id in ids))

    first, again = await checkpoints(), await checkpoints(again=True)
    assert [seq for seq, _ in first] == [seq for seq, _ in again] == [1, 1, 1]
    assert [p.tokens_used for _, p in again] == [15, 15, 15]

    started = {run_id: uuid.uuid4() for run_id in ids}

    async def starts(again: bool = False) -> list[Any]:
        return await asyncio.gather(*(batched.start_tool(
            run_id, "w", 30, write_id=started[run_id], tool_use_id="toolu_1", tool_name="noop", request="{}",
            again=again,
        ) for run_id in ids))

    assert [(seq, attempts) for seq, attempts, _ in await starts()] == [(2, 1)] * 3
    assert [(seq, attempts) for seq, attempts, _ in await starts(again=True)] == [(2, 1)] * 3
    finished = {run_id: uuid.uuid4() for run_id in ids}

    async def finishes(again: bool = False) -> list[Any]:
        return await asyncio.gather(*(batched.finish_tool(
            run_id, "w", 30, write_id=finished[run_id], tool_use_id="toolu_1", ok=True, output="ok", latency_ms=1,
            again=again,
        ) for run_id in ids))

    await finishes()
    await finishes(again=True)
    for run_id in ids:
        steps = await batched.steps(run_id)
        assert [(s.kind.value, s.status.value, s.attempts) for s in steps] == [("MODEL", "DONE", 1), ("TOOL", "DONE", 1)]
        run = await batched.get(run_id)
        assert run is not None and run.tokens_used == 15
    assert batched.writes.stats.largest == 3 and batched.writes.stats.split == 0


async def test_a_batch_of_different_writes_goes_in_one_transaction(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    batched = RunStore(store.pool, GroupCommit(store.pool, senders=1))
    a, b, c, d = await _held(batched, 4)
    await batched.start_tool(b, "w", 30, tool_use_id="toolu_b", tool_name="noop", request="{}")
    await batched.start_tool(c, "w", 30, tool_use_id="toolu_c", tool_name="noop", request="{}")
    await asyncio.gather(
        _checkpoint(batched, a, "w"),
        batched.finish_tool(b, "w", 30, tool_use_id="toolu_b", ok=True, output="ok", latency_ms=1),
        batched.finish_tool(c, "w", 30, tool_use_id="toolu_c", ok=False, output="error: no", latency_ms=1),
        batched.add_user_step(d, "w", 30, text="and then?"),
    )
    assert batched.writes.stats.largest == 4
    cur = await db.execute("SELECT count(DISTINCT xmin::text) FROM run_step WHERE finished_at IS NOT NULL")
    assert await cur.fetchone() == (1,)
    assert [s.status.value for s in await batched.steps(c)] == ["ERROR"]


async def test_a_compact_step_in_a_batch_of_model_steps_keeps_its_kind(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    """A summarising call is checkpointed like a model call, through the same shared statement."""
    batched = RunStore(store.pool, GroupCommit(store.pool, senders=1))
    ids = await _held(batched, 4)
    await asyncio.gather(*(batched.checkpoint_model(
        run_id, "w", 30, ModelTurn('{"strategy": "summarize"}', "summary", "end_turn", Usage(7, 3, 0, 0), None, 0),
        kind=StepKind.COMPACT if i % 2 else StepKind.MODEL) for i, run_id in enumerate(ids)))
    assert batched.writes.stats.largest == 4
    cur = await db.execute("SELECT run_id, kind FROM run_step")
    kinds = dict(await cur.fetchall())
    assert [kinds[run_id] for run_id in ids] == ["MODEL", "COMPACT", "MODEL", "COMPACT"]


async def test_a_batch_waits_a_moment_for_the_writers_it_just_answered(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight runs whose next write follows at once, but each after a few turns of the event loop: without the
    wait (groupcommit.RETURN_WAIT) the second writes went in whatever batches the senders formed as they came
    back; with it, they go as one. (The wait is made long here, so that a loaded machine's slow turns do not
    end it: what is tested is what it waits for.)"""
    monkeypatch.setattr(groupcommit, "RETURN_WAIT", 10.0)
    batched = RunStore(store.pool, GroupCommit(store.pool))
    ids = await _held(batched, 8)

    async def two_writes(run_id: uuid.UUID, turns: int) -> None:
        await _checkpoint(batched, run_id, "w")
        for _ in range(turns):  # the step between two writes: no I/O, a few turns of the loop, more for some
            await asyncio.sleep(0)
        await _checkpoint(batched, run_id, "w")

    await asyncio.gather(*(two_writes(run_id, 2 * i) for i, run_id in enumerate(ids)))
    assert (batched.writes.stats.writes, batched.writes.stats.batches, batched.writes.stats.largest) == (16, 2, 8)


async def test_a_lone_write_waits_no_longer_than_the_return_wait(store: RunStore) -> None:
    """A run answered and gone to a slow model call is waited for RETURN_WAIT at most by the next batch."""
    batched = RunStore(store.pool, GroupCommit(store.pool))
    away, here = await _held(batched, 2)
    await _checkpoint(batched, away, "w")  # answered: expected back, but it does not write again
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await _checkpoint(batched, here, "w")
    assert loop.time() - t0 < 5.0  # the wait is a millisecond (not until `away` writes again); then a round trip
