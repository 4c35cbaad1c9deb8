"""The claim and tenants: `max_running` holds across workers claiming at once, the workers are shared among
tenants by weight within a priority, and a slot a limited tenant frees is used at once."""

from __future__ import annotations

import asyncio
import collections
import random
from collections.abc import Iterator
from typing import Any

import psycopg

from agentrun.worker.core.records import RunStatus
from agentrun.worker.store import Claim, RunStore
from agentrun.worker.store.channels import WAKE_CHANNEL
from agentrun.worker.store.claims import LOCK_LIMITED
from agentrun.worker.testing.scripted import ScriptedLlm
from tests.support.builders import worker
from tests.support.waiting import eventually

LEASE = 30.0


async def queue(db: psycopg.AsyncConnection[Any], tenant: str, n: int, *, priority: int = 0, age: float = 0.0) -> None:
    """`n` runs of `tenant` queued in one statement, oldest first, the newest `age` seconds old."""
    await db.execute("INSERT INTO tenant (name) VALUES (%s) ON CONFLICT DO NOTHING", (tenant,))
    await db.execute(
        """INSERT INTO run (id, input, model, token_budget, timeout_seconds, deadline_at, run_at, priority, tenant)
           SELECT gen_random_uuid(), 'queued ' || i, 'claude-sonnet-4-5', 1000, 3600, now() + interval '1 hour',
                  now() - make_interval(secs => %(age)s + (%(n)s - i) * 0.001), %(priority)s, %(tenant)s
           FROM generate_series(1, %(n)s) AS i""",
        {"tenant": tenant, "n": n, "priority": priority, "age": age},
    )


async def set_tenant(db: psycopg.AsyncConnection[Any], tenant: str, **fields: Any) -> None:
    for column, value in fields.items():
        assert column in ("max_running", "weight")
        await db.execute(f"UPDATE tenant SET {column} = %s WHERE name = %s", (value, tenant))


async def running(db: psycopg.AsyncConnection[Any], tenant: str) -> int:
    cur = await db.execute("SELECT count(*) FROM run WHERE tenant = %s AND status = 'RUNNING'", (tenant,))
    return int((await cur.fetchone())[0])  # type: ignore[index]


def tenants(claims: list[Claim]) -> collections.Counter[str]:
    return collections.Counter(c.run.tenant for c in claims)


async def test_workers_claiming_at_once_never_take_more_than_max_running(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    await queue(db, "limited", 60, age=1.0)  # first in line: every claim wants them
    await queue(db, "free", 200)
    await set_tenant(db, "limited", max_running=3)
    for round_ in range(6):
        got = await asyncio.gather(*(
            store.claim_many(f"worker-{round_}-{i}", LEASE, limit=random.randint(2, 6)) for i in range(8)
        ))
        assert await running(db, "limited") <= 3, f"round {round_}"
        assert sum(tenants(g)["limited"] for g in got) <= 3
        # A second wave while the first holds its runs: still nothing over the limit.
        await asyncio.gather(*(store.claim_many(f"again-{round_}-{i}", LEASE, limit=3) for i in range(8)))
        assert await running(db, "limited") <= 3, f"round {round_}, second wave"
        await db.execute("UPDATE run SET status = 'QUEUED', locked_by = NULL, locked_until = NULL")
    # Nobody else contending: the limit is reached, not merely respected.
    await store.claim_many("alone", LEASE, limit=64)
    assert await running(db, "limited") == 3


async def test_a_tenant_at_its_limit_is_skipped_and_its_next_run_is_taken_once_a_slot_frees(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    await queue(db, "a", 5, age=10.0)  # the oldest, and first in line without a limit
    await queue(db, "b", 5)
    await set_tenant(db, "a", max_running=1)
    first = await store.claim_many("w1", LEASE, limit=4)
    assert tenants(first) == {"a": 1, "b": 3}
    second = await store.claim_many("w2", LEASE, limit=4)
    assert tenants(second) == {"b": 2}  # a is at its limit: skipped, b's runs taken
    assert await store.claim_many("w2", LEASE, limit=4) == []

    held = next(c.run for c in first if c.run.tenant == "a")
    await store.finish(held.id, "w1", RunStatus.SUCCEEDED, None, epoch=held.lease_epoch)
    third = await store.claim_many("w3", LEASE, limit=4)
    assert tenants(third) == {"a": 1}
    assert await store.claim_many("w3", LEASE, limit=4) == []


async def test_a_waiting_run_holds_no_slot(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    await queue(db, "a", 3)
    await set_tenant(db, "a", max_running=1)
    (held,) = await store.claim_many("w1", LEASE, limit=4)
    assert await store.claim_many("w2", LEASE, limit=4) == []
    await store.park_timer(held.run.id, "w1", "toolu_1", seconds=3600, epoch=held.run.lease_epoch)
    assert tenants(await store.claim_many("w2", LEASE, limit=4)) == {"a": 1}


async def test_a_small_tenant_is_not_queued_behind_a_big_backlog(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    await queue(db, "big", 500, age=10.0)
    await queue(db, "small", 5)
    taken: list[Claim] = []
    for i in range(3):
        taken += await store.claim_many(f"w{i}", LEASE, limit=4)
    assert tenants(taken)["small"] == 5  # in the first three claims, not after 500 older runs
    # Each tenant's own runs still go oldest first.
    small = [c.run.run_at for c in taken if c.run.tenant == "small"]
    assert small == sorted(small)


async def test_weights_share_the_claims(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    await queue(db, "heavy", 100)
    await queue(db, "light", 100, age=5.0)
    await set_tenant(db, "heavy", weight=3)
    taken: list[Claim] = []
    for i in range(10):
        taken += await store.claim_many(f"w{i}", LEASE, limit=4)
    share = tenants(taken)
    assert len(taken) == 40 and 28 <= share["heavy"] <= 32, share


async def test_each_of_more_tenants_than_a_claim_looks_at_gets_its_turn(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    # A claim of one run looks at the first few tenants of the fair order only (`picked`): 30 tenants of
    # equal share are each served once before any is served twice, oldest first among them.
    for i in range(30):
        await queue(db, f"t{i}", 3, age=30.0 - i)
    order = [c.run.tenant for i in range(45) for c in await store.claim_many(f"w{i}", LEASE, limit=1)]
    assert order[:30] == [f"t{i}" for i in range(30)]
    assert collections.Counter(order[30:]) == {f"t{i}": 1 for i in range(15)}


async def test_tenants_at_their_limit_take_no_place_of_a_tenant_with_room(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    for i in range(12):
        await queue(db, f"full{i}", 2, age=60.0)
        await set_tenant(db, f"full{i}", max_running=0)
    await queue(db, "free", 2)  # the newest runs, behind twelve tenants that may run none
    assert tenants(await store.claim_many("w1", LEASE, limit=1)) == {"free": 1}


async def test_a_tenant_with_no_row_is_served_with_the_default_share(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    await queue(db, "known", 20, age=10.0)
    await queue(db, "unknown", 2)
    await db.execute("DELETE FROM tenant WHERE name = 'unknown'")  # made by another way than the door
    taken: list[Claim] = []
    for i in range(2):
        taken += await store.claim_many(f"w{i}", LEASE, limit=2)
    assert tenants(taken) == {"known": 2, "unknown": 2}


async def test_runs_not_due_hide_no_tenant(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    await queue(db, "later", 5, priority=9)
    await db.execute("UPDATE run SET run_at = now() + interval '1 hour' WHERE tenant = 'later'")
    await queue(db, "now", 1)
    got = await store.claim_many("w1", LEASE, limit=4)
    assert tenants(got) == {"now": 1}


async def test_claimers_at_once_across_many_tenants_take_each_run_once(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    for i in range(40):
        await queue(db, f"t{i}", 5, priority=i % 3)
    got = await asyncio.gather(*(store.claim_many(f"w{i}", LEASE, limit=3) for i in range(8)))
    ids = [c.run.id for g in got for c in g]
    assert len(ids) == len(set(ids)) == 24  # every claim filled, none twice: losers looked further


async def test_priority_goes_before_the_fair_share(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    await queue(db, "urgent", 10, priority=5)
    await queue(db, "other", 10, age=5.0)
    await store.claim_many("w0", LEASE, limit=3)  # urgent has three running, other none
    got = await store.claim_many("w1", LEASE, limit=4)
    assert tenants(got) == {"urgent": 4}
    assert [c.run.priority for c in got] == [5, 5, 5, 5]


async def test_a_changed_limit_applies_at_the_next_claim(store: RunStore, db: psycopg.AsyncConnection[Any]) -> None:
    await queue(db, "a", 20)
    await set_tenant(db, "a", max_running=2)
    assert len(await store.claim_many("w1", LEASE, limit=10)) == 2
    await set_tenant(db, "a", max_running=5)
    assert len(await store.claim_many("w1", LEASE, limit=10)) == 3
    await set_tenant(db, "a", max_running=1)
    assert await store.claim_many("w1", LEASE, limit=10) == []
    await set_tenant(db, "a", max_running=None)
    assert len(await store.claim_many("w1", LEASE, limit=10)) == 10


async def test_a_dead_workers_run_is_taken_over_though_its_tenant_is_at_its_limit(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    await queue(db, "a", 3)
    await set_tenant(db, "a", max_running=1)
    (held,) = await store.claim_many("dead", LEASE, limit=4)
    await db.execute("UPDATE run SET locked_until = now() - interval '1 second' WHERE id = %s", (held.run.id,))
    got = await store.claim_many("survivor", LEASE, limit=4)
    assert [(c.run.id, c.taken_from) for c in got] == [(held.run.id, "dead")]  # no queued run beside it
    assert await running(db, "a") == 1


async def test_a_run_of_a_limited_tenant_that_stops_running_wakes_the_workers(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    await queue(db, "limited", 2)
    await queue(db, "free", 2)
    await set_tenant(db, "limited", max_running=1)
    claims = await store.claim_many("w1", LEASE, limit=4)
    await db.execute(f"LISTEN {WAKE_CHANNEL}")
    for c in claims:
        await store.finish(c.run.id, "w1", RunStatus.SUCCEEDED, None, epoch=c.run.lease_epoch)
        heard = [n async for n in _notifications(db)]
        assert bool(heard) == (c.run.tenant == "limited"), c.run.tenant


async def _notifications(db: psycopg.AsyncConnection[Any]) -> Any:
    async for n in db.notifies(timeout=0.5, stop_after=1):
        yield n


async def test_a_freed_slot_wakes_an_idle_worker_before_its_poll(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    """An idle worker that found the tenant at its limit sleeps its whole poll (a minute here) unless told."""

    class Counting(RunStore):
        empty = 0

        async def claim_many(self, *args: Any, **kw: Any) -> list[Claim]:
            got = await super().claim_many(*args, **kw)
            self.empty += not got
            return got

    await queue(db, "a", 2)
    await set_tenant(db, "a", max_running=1)
    (held,) = await store.claim_many("elsewhere", LEASE, limit=1)
    counting = Counting(store.pool)
    idle = worker(counting, ScriptedLlm().then_text("done"), name="idle", poll=60.0, liveness_lock=False)

    async def taken() -> bool:
        cur = await db.execute("SELECT count(*) FROM run WHERE locked_by = 'idle'")
        return bool((await cur.fetchone())[0])  # type: ignore[index]

    serving = asyncio.create_task(idle.run())
    try:
        await eventually(lambda: _true(counting.empty >= 1), what="the idle worker's first claim")
        assert not await taken()  # its tenant is at its limit: nothing for it yet
        await store.finish(held.run.id, "elsewhere", RunStatus.SUCCEEDED, None, epoch=held.run.lease_epoch)
        await eventually(taken, timeout=20.0, what="the next run taken by the idle worker")
    finally:
        idle.stop()
        await asyncio.wait_for(serving, 30)


async def _true(value: bool) -> bool:
    return value




async def test_the_tenants_lock_reads_no_more_than_each_limited_tenants_first_run(
    store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    """B11: the first statement of a claim probed each tenant's queued runs by a semi-join the planner made of its
    EXISTS, hashing every queued run of the table (5 ms a claim with 20,000 queued, against 0.2 ms): the
    claim's cost grew with the backlog. It must read each limited tenant's first queued run by the index."""
    await queue(db, "big", 5000)
    await queue(db, "limited", 10)
    await queue(db, "idle-limited", 0)
    await set_tenant(db, "limited", max_running=3)
    await set_tenant(db, "idle-limited", max_running=3)
    await db.execute("ANALYZE run")
    for limited in (True, False):
        if not limited:
            await db.execute("UPDATE tenant SET max_running = NULL")
        cur = await db.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + LOCK_LIMITED.encode())
        plan = (await cur.fetchone())[0][0]["Plan"]  # type: ignore[index]
        reads = list(_nodes(plan))
        assert ("Seq Scan", "run") not in reads and not any("Hash" in node for node, _ in reads), (limited, reads)


def _nodes(plan: dict[str, Any]) -> Iterator[tuple[str, str | None]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan: its type and the relation it reads."""
    yield plan["Node Type"], plan.get("Relation Name")
    for child in plan.get("Plans", ()):
        yield from _nodes(child)
