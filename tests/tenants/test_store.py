"""Tenants in the store: a run is its tenant's, a tenant's row is made with its first run, and an
Idempotency-Key is its tenant's."""

from __future__ import annotations

import asyncio

import pytest

from agentrun.worker.core.records import NewRun
from agentrun.worker.store import RunStore


def new(tenant: str = "default", key: str | None = None) -> NewRun:
    return NewRun(input="hi", model="m", token_budget=1000, timeout_seconds=60, idempotency_key=key, tenant=tenant)


async def test_a_run_is_its_tenants_and_its_first_run_makes_the_tenants_row(store: RunStore) -> None:
    run, created = await store.create(new("team-a"))
    assert created and run.tenant == "team-a" and run.throttled is None
    async with store.pool.connection() as conn:
        names = [r[0] for r in await (await conn.execute("SELECT name FROM tenant ORDER BY name")).fetchall()]
    assert names == ["default", "team-a"]
    assert (await store.create(new()))[0].tenant == "default"


async def test_an_idempotency_key_is_its_tenants(store: RunStore) -> None:
    a, a_created = await store.create(new("team-a", "k1"))
    again, again_created = await store.create(new("team-a", "k1"))
    b, b_created = await store.create(new("team-b", "k1"))
    assert a_created and not again_created and again.id == a.id
    assert b_created and b.id != a.id and b.tenant == "team-b"


async def test_concurrent_first_runs_of_a_tenant_make_one_row(store: RunStore) -> None:
    made = await asyncio.gather(*(store.create(new("team-c")) for _ in range(8)))
    assert all(created for _, created in made)
    async with store.pool.connection() as conn:
        count = (await (await conn.execute("SELECT count(*) FROM tenant WHERE name = 'team-c'")).fetchone())
    assert count == (1,)


@pytest.mark.parametrize("name", ["Team", "-a", "a_b", "", "x" * 64])
async def test_a_bad_tenant_name_is_refused_before_anything_is_written(store: RunStore, name: str) -> None:
    with pytest.raises(ValueError, match="not a tenant name"):
        await store.create(new(name))
    assert await store.list_runs() == []
