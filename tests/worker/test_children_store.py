"""Child runs in the database: made once per call, the parent parked in the same write, and the parent
queued again exactly when its last child ends, however the children end and however close together."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest

from agentrun.worker.core.errors import CancelRequested
from agentrun.worker.core.records import NewRun, Run, RunStatus
from agentrun.worker.store import RunStore
from tests.support.builders import new_run
from tests.support.waiting import eventually


async def held(store: RunStore, run_id: uuid.UUID, worker: str = "w-parent") -> Run:
    claimed = await store.claim(worker, 30)
    assert claimed is not None and claimed.run.id == run_id
    return claimed.run


def child_of(parent: Run, tool_use_id: str, **kw: Any) -> NewRun:
    return new_run(f"task for {tool_use_id}", spawned_by=(parent.id, tool_use_id),
                   root_run_id=parent.root_run_id or parent.id, depth=parent.depth + 1, **kw)


async def finish_child(store: RunStore, child: Run, status: RunStatus = RunStatus.SUCCEEDED) -> None:
    claimed = await store.claim(f"w-{child.id.hex[:6]}", 30)
    assert claimed is not None
    await store.finish(claimed.run.id, f"w-{child.id.hex[:6]}", status, None, output="done",
                       epoch=claimed.run.lease_epoch)


async def test_spawn_makes_each_child_once_and_parks_the_parent(store: RunStore) -> None:
    parent, _ = await store.create(new_run())
    parent = await held(store, parent.id)
    calls = [child_of(parent, "toolu_a"), child_of(parent, "toolu_b")]
    assert await store.spawn(parent.id, "w-parent", calls, epoch=parent.lease_epoch) is True
    # The same calls again, with new ids (a driver that crashed and replays): no second child, and the
    # copy of a write whose outcome was lost counts as done.
    again = [child_of(parent, "toolu_a"), child_of(parent, "toolu_b")]
    assert await store.spawn(parent.id, "w-parent", again, epoch=parent.lease_epoch, again=True) is True
    children = await store.children(parent.id)
    assert [c.parent_tool_use_id for c in children] == ["toolu_a", "toolu_b"]
    assert all(c.root_run_id == parent.id and c.depth == 1 and c.parent_run_id == parent.id for c in children)
    after = await store.get(parent.id)
    assert after is not None
    assert (after.status, after.waiting_for, after.children_active, after.pending, after.locked_by) == (
        RunStatus.WAITING, "children", 2, 2, None)


async def test_the_last_child_to_end_queues_the_parent_with_the_totals(store: RunStore) -> None:
    parent, _ = await store.create(new_run())
    parent = await held(store, parent.id)
    await store.spawn(parent.id, "w-parent", [child_of(parent, "toolu_a"), child_of(parent, "toolu_b")],
                      epoch=parent.lease_epoch)
    first, second = await store.children(parent.id)
    await finish_child(store, first)
    mid = await store.get(parent.id)
    assert mid is not None and (mid.status, mid.children_active) == (RunStatus.WAITING, 1)
    await finish_child(store, second, RunStatus.FAILED)
    after = await store.get(parent.id)
    assert after is not None
    assert (after.status, after.waiting_for, after.children_active, after.pending) == (RunStatus.QUEUED, None, 0, 0)
    assert await store.claim("w-parent", 30) is not None  # claimable again


async def test_children_ending_at_the_same_moment_wake_the_parent_once(database_url: str, store: RunStore) -> None:
    """Each child's end counts itself on the parent under the parent's row lock: of two ending together,
    the second sees the first, whatever order they commit in."""
    for round_ in range(8):
        parent, _ = await store.create(new_run(f"round {round_}"))
        parent = await held(store, parent.id)
        await store.spawn(parent.id, "w-parent", [child_of(parent, f"toolu_{i}") for i in range(3)],
                          epoch=parent.lease_epoch)
        children = await store.children(parent.id)

        async def end(child: Run) -> None:
            async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
                await conn.execute("UPDATE run SET status = 'SUCCEEDED', finished_at = now() WHERE id = %s",
                                   (child.id,))

        await asyncio.gather(*(end(c) for c in children))
        after = await store.get(parent.id)
        assert after is not None and (after.status, after.children_active) == (RunStatus.QUEUED, 0), round_
        claimed = await store.claim("w-parent", 30)
        assert claimed is not None
        await store.finish(parent.id, "w-parent", RunStatus.SUCCEEDED, None, epoch=claimed.run.lease_epoch)


async def test_a_child_that_ends_while_the_parent_parks_is_not_missed(database_url: str, store: RunStore) -> None:
    """A child ends while the parent's park statement waits for the parent's row: the park re-checks the
    count on the row itself, so the parent is not left waiting for a child that has already ended."""
    parent, _ = await store.create(new_run())
    parent = await held(store, parent.id)
    await store.spawn(parent.id, "w-parent", [child_of(parent, "toolu_a")], epoch=parent.lease_epoch)
    (child,) = await store.children(parent.id)
    # The parent resumes (as if woken early) while its child still works, and parks again; the child
    # ends holding the parent's row lock at that very moment.
    await (await psycopg.AsyncConnection.connect(database_url, autocommit=True)).execute(
        "UPDATE run SET status = 'RUNNING', waiting_for = NULL, locked_by = 'w-parent', "
        "locked_until = now() + interval '30 s' WHERE id = %s", (parent.id,))
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        await conn.execute("UPDATE run SET status = 'SUCCEEDED', finished_at = now() WHERE id = %s", (child.id,))
        park = asyncio.create_task(store.spawn(parent.id, "w-parent", [], epoch=parent.lease_epoch))
        await eventually(lambda: _waiting_on_a_lock(database_url), 30, "the park to wait for the parent's row")
        assert not park.done()
        await conn.commit()
    assert await park is False  # nothing left to wait for: the parent goes on
    after = await store.get(parent.id)
    assert after is not None and (after.status, after.children_active) == (RunStatus.RUNNING, 0)


async def _waiting_on_a_lock(database_url: str, at_least: int = 1) -> bool:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                 "AND wait_event_type = 'Lock'")
        row = await cur.fetchone()
        return bool(row and row[0] >= at_least)


async def test_cancel_cascades_to_every_descendant(store: RunStore) -> None:
    parent, _ = await store.create(new_run())
    parent = await held(store, parent.id)
    await store.spawn(parent.id, "w-parent", [child_of(parent, "toolu_a"), child_of(parent, "toolu_b")],
                      epoch=parent.lease_epoch)
    a, b = await store.children(parent.id)
    claimed = await store.claim("w-a", 30)  # a runs, and has a child of its own
    assert claimed is not None
    a_run = claimed.run
    await store.spawn(a_run.id, "w-a", [child_of(a_run, "toolu_c")], epoch=a_run.lease_epoch)
    (c,) = await store.children(a_run.id)
    after = await store.cancel(parent.id, by="alice")
    assert after is not None and after.status is RunStatus.CANCELLED
    assert after.error == "cancelled while waiting for its sub-agents"
    for child in (a, b, c):
        got = await store.get(child.id)
        assert got is not None and got.status is RunStatus.CANCELLED and got.cancelled_by == "alice", child.id


async def test_a_cancel_before_the_spawn_starts_no_child(store: RunStore) -> None:
    """A cancel that lands between the sub-agent turn's checkpoint and the spawn: the parent is held, so the
    cancel only asks it to stop; the spawn, fenced on that ask too, makes no child and parks nothing."""
    parent, _ = await store.create(new_run())
    parent = await held(store, parent.id)
    asked = await store.cancel(parent.id, by="alice")
    assert asked is not None and asked.status is RunStatus.RUNNING and asked.cancel_requested
    with pytest.raises(CancelRequested):
        await store.spawn(parent.id, "w-parent", [child_of(parent, "toolu_a")], epoch=parent.lease_epoch)
    assert await store.children(parent.id) == []
    after = await store.get(parent.id)
    assert after is not None and (after.status, after.children_active, after.locked_by) == (
        RunStatus.RUNNING, 0, "w-parent")  # still held: the engine ends it CANCELLED


async def test_a_cancel_racing_the_spawn_reaches_every_child(database_url: str, store: RunStore) -> None:
    """The spawn and the cancel both wait for the parent's row, the spawn first. The cancel's statement
    began before the spawn committed, so its snapshot shows no child: it must still reach the children."""
    for round_ in range(3):
        parent, _ = await store.create(new_run(f"round {round_}"))
        parent = await held(store, parent.id)
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            await conn.execute("SELECT 1 FROM run WHERE id = %s FOR UPDATE", (parent.id,))
            spawn = asyncio.create_task(store.spawn(
                parent.id, "w-parent", [child_of(parent, "toolu_a"), child_of(parent, "toolu_b")],
                epoch=parent.lease_epoch))
            await eventually(lambda: _waiting_on_a_lock(database_url, 1), 30, "the spawn to wait for the row")
            cancel = asyncio.create_task(store.cancel(parent.id, by="alice"))
            await eventually(lambda: _waiting_on_a_lock(database_url, 2), 30, "the cancel to wait for the row")
            await conn.rollback()
        try:
            parked = await spawn
        except CancelRequested:
            parked = False  # the cancel came first: no child was made
        await cancel
        children = await store.children(parent.id)
        assert len(children) == (2 if parked else 0), round_
        for child in children:
            assert child.status is RunStatus.CANCELLED and child.cancelled_by == "alice", (round_, child.id)
        after = await store.get(parent.id)
        assert after is not None and after.cancel_requested


async def test_a_cancel_that_deadlocks_with_a_childs_end_is_taken_again(database_url: str, store: RunStore) -> None:
    """The cancel locks the parent's row, then its children's; a child's end locks the child's row, then its
    parent's (it counts itself there). Met halfway, PostgreSQL breaks the circle by failing one of them:
    when it is the cancel, the cancel is taken again, not answered with an error."""
    parent, _ = await store.create(new_run())
    parent = await held(store, parent.id)
    await store.spawn(parent.id, "w-parent", [child_of(parent, "toolu_a")], epoch=parent.lease_epoch)
    (child,) = await store.children(parent.id)
    async with await psycopg.AsyncConnection.connect(database_url) as ending:
        await ending.execute("UPDATE run SET priority = priority WHERE id = %s", (child.id,))  # the child's row
        cancel = asyncio.create_task(store.cancel(parent.id, by="alice"))
        await eventually(lambda: _waiting_on_a_lock(database_url, 1), 30, "the cancel to wait for the child's row")
        # The child's end now wants its parent's row, which the cancel holds: a circle. The cancel waited
        # first, so it is the one PostgreSQL fails (deadlock_timeout after it began to wait).
        await ending.execute("UPDATE run SET children_active = children_active WHERE id = %s", (parent.id,))
        await ending.commit()
    after = await asyncio.wait_for(cancel, 30)
    assert after is not None and after.status is RunStatus.CANCELLED and after.cancelled_by == "alice"
    got = await store.get(child.id)
    assert got is not None and got.status is RunStatus.CANCELLED


async def test_children_of_an_ended_parent_are_cancelled_by_the_sweep(store: RunStore, db: Any) -> None:
    """A cancel whose cascade was lost (its caller died between the two statements), or a parent that
    timed out while waiting: the housekeeping sweep cancels the children left."""
    parent, _ = await store.create(new_run())
    parent = await held(store, parent.id)
    await store.spawn(parent.id, "w-parent", [child_of(parent, "toolu_a")], epoch=parent.lease_epoch)
    await db.execute("UPDATE run SET status = 'TIMED_OUT', finished_at = now() WHERE id = %s", (parent.id,))
    (child,) = await store.children(parent.id)
    assert await store.cancel_orphans() == [child.id]
    got = await store.get(child.id)
    assert got is not None and got.status is RunStatus.CANCELLED
    assert await store.cancel_orphans() == []


@pytest.mark.parametrize("status", [RunStatus.SUCCEEDED, RunStatus.FAILED])
async def test_totals_count_the_descendants(store: RunStore, db: Any, status: RunStatus) -> None:
    parent, _ = await store.create(new_run())
    parent = await held(store, parent.id)
    await store.spawn(parent.id, "w-parent", [child_of(parent, "toolu_a")], epoch=parent.lease_epoch)
    (child,) = await store.children(parent.id)
    await db.execute("UPDATE run SET tokens_used = 120, cost_usd = 0.5 WHERE id = %s", (child.id,))
    live = await store.get(parent.id)
    assert live is not None and (live.tokens_used_total, live.children_tokens) == (120, 0)  # counted live
    await finish_child(store, child, status)
    after = await store.get(parent.id)
    assert after is not None and (after.tokens_used_total, after.children_tokens) == (120, 120)
    assert after.cost_usd_total == after.children_cost == pytest.approx(0.5)
