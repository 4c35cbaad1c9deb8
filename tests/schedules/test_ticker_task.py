"""The ticker is one task of Worker.run, beside housekeeping: cancelled and awaited when the worker stops,
and when Worker.run ends by an exception; while it runs, due schedules get their runs; and idle it costs
one statement per look."""

from __future__ import annotations

import asyncio

import pytest

from agentrun.worker.core.schedules import Schedule, spec_json
from agentrun.worker.core.submission import RunSpec
from agentrun.worker.runtime.schedules import Ticker
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from tests.support.builders import worker
from tests.support.waiting import eventually

SPEC = RunSpec(input="tick", token_budget=1000, timeout_seconds=60)


def _ticker_tasks(name: str) -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == f"{name}-schedules"]


async def test_the_ticker_runs_in_worker_run_and_stops_with_it(store: RunStore) -> None:
    w = worker(store, ScriptedLlm(), name="tick-w")
    task = asyncio.create_task(w.run())
    async def started() -> bool:
        return bool(_ticker_tasks("tick-w"))

    await eventually(started, 10, "the ticker task")
    (ticker,) = _ticker_tasks("tick-w")
    await store.create_schedule(Schedule("s1", None, 1, "UTC", {}, spec_json(SPEC)))

    async def a_run() -> bool:
        return bool(await store.schedule_runs("s1", 5))

    await eventually(a_run, 30, "a run of the schedule")
    w.stop()
    await asyncio.wait_for(task, 30)
    assert ticker.done()


async def test_an_exception_in_worker_run_cancels_and_awaits_the_ticker(store: RunStore) -> None:
    w = worker(store, ScriptedLlm(), name="tick-x")
    seen: list[asyncio.Task[object]] = []

    async def broken(seconds: float) -> None:
        seen.extend(_ticker_tasks("tick-x"))
        raise RuntimeError("boom")

    w._idle = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="boom"):
        await asyncio.wait_for(w.run(), 30)
    assert seen and all(t.done() for t in seen)
    assert _ticker_tasks("tick-x") == []


async def test_idle_ticker_sleeps_until_the_next_due_time(store: RunStore) -> None:
    looks = 0
    real = store.next_due_in

    async def counted() -> float | None:
        nonlocal looks
        looks += 1
        return await real()

    store.next_due_in = counted  # type: ignore[method-assign]
    ticker = Ticker(store, "idle", "claude-sonnet-4-5", max_sleep=0.5)
    task = asyncio.create_task(ticker.run())
    try:
        await asyncio.sleep(1.2)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert 1 <= looks <= 4  # one statement per look, a look per max_sleep at most when nothing is due
