"""The chaos run's connection-level fault proxy: it forwards, and each fault does what it says."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from bench.fault_proxy import KINDS, Fault, FaultPlan, FaultProxy


def test_the_schedule_is_seeded_bounded_and_has_every_kind() -> None:
    plan = FaultPlan(seed=7, faults=9, every=0.5, longest=1.0)
    faults = plan.schedule()
    assert faults == FaultPlan(seed=7, faults=9, every=0.5, longest=1.0).schedule()
    assert faults != FaultPlan(seed=8, faults=9, every=0.5, longest=1.0).schedule()
    assert len(faults) == 9 and {f.kind for f in faults} == set(KINDS)
    assert all(f.seconds <= max(1.0, plan.slow_window) for f in faults)
    assert faults[-1].at <= 9 * 0.5 * 1.5


async def test_it_forwards_cuts_stalls_and_slows_new_connections(database_url: str) -> None:
    proxy = await FaultProxy(database_url).start()
    try:
        async with await psycopg.AsyncConnection.connect(proxy.url, autocommit=True) as conn:
            assert await (await conn.execute("SELECT 1")).fetchone() == (1,)
            await proxy.inject(Fault(0, "delay", 0.3, 0.0), 0)
            stall = asyncio.create_task(proxy.inject(Fault(0, "stall", 0.5, 0.0), 0))
            await asyncio.sleep(0)
            t0 = time.monotonic()
            assert await (await conn.execute("SELECT 2")).fetchone() == (2,)
            assert time.monotonic() - t0 >= 0.4  # held until the stall ended
            await stall
            await proxy.inject(Fault(0, "cut", 0, 0.0), 0)
            with pytest.raises(psycopg.OperationalError):
                await conn.execute("SELECT 3")
        slow = asyncio.create_task(proxy.inject(Fault(0, "slow_connects", 1.0, 0.0), 0.6))
        await asyncio.sleep(0)
        t0 = time.monotonic()
        async with await psycopg.AsyncConnection.connect(proxy.url, autocommit=True) as conn:
            assert time.monotonic() - t0 >= 0.5
            half = asyncio.create_task(proxy.inject(Fault(0, "half_open", 0.3, 0.0, "to_client"), 0))
            await asyncio.sleep(0)
            with pytest.raises(psycopg.OperationalError):  # no answer, then the connection is cut
                await conn.execute("SELECT 4")
            await half
        await slow
        assert proxy.counts == {"delay": 1, "stall": 1, "cut": 1, "slow_connects": 1, "slowed connects": 1,
                                "half_open": 1}
    finally:
        await proxy.stop()
