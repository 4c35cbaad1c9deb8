"""The sender is one task of Worker.run, beside the housekeeping: cancelled and awaited when the worker
stops, also when Worker.run leaves by an exception."""

from __future__ import annotations

import asyncio

import pytest

from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from tests.support.builders import SimulatedCrash, worker


class Sender:
    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.ended = False

    async def run(self) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        finally:
            self.ended = True


async def test_the_sender_ends_with_worker_run_also_on_an_exception(store: RunStore) -> None:
    w = worker(store, ScriptedLlm())
    sender = Sender()
    w.webhooks = sender  # type: ignore[assignment]

    async def crash(limit: int) -> list[object]:
        await sender.started.wait()
        raise SimulatedCrash()

    w._claim = crash  # type: ignore[assignment,method-assign]
    with pytest.raises(SimulatedCrash):
        await w.run()
    assert sender.ended


async def test_the_sender_ends_when_the_worker_stops(store: RunStore) -> None:
    w = worker(store, ScriptedLlm())
    sender = Sender()
    w.webhooks = sender  # type: ignore[assignment]
    task = asyncio.create_task(w.run())
    await asyncio.wait_for(sender.started.wait(), 30)
    w.stop()
    await asyncio.wait_for(task, 30)
    assert sender.ended
