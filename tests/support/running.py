"""In-process workers looping for the length of a block, and waiting for a run they drive to finish."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import psycopg

from agentrun.worker.core.records import Run
from agentrun.worker.runtime.runner import Worker
from agentrun.worker.store import RunStore
from tests.support.waiting import eventually


@contextlib.asynccontextmanager
async def running(*workers: Worker, timeout: float = 60) -> AsyncIterator[None]:
    """Each worker's loop in a task of this event loop; on exit they are stopped (as SIGTERM does) and
    waited for, `timeout` seconds at most."""
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        yield
    finally:
        for w in workers:
            w.stop()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout)


async def finished(store: RunStore, run_id: uuid.UUID, timeout: float = 30) -> Run:
    """The run once it has ended; the database may be away meanwhile (a fault test cut it)."""
    async def done() -> bool:
        with contextlib.suppress(psycopg.OperationalError):
            r = await store.get(run_id)
            return r is not None and r.status.terminal
        return False

    await eventually(done, timeout, "the run to finish")
    run = await store.get(run_id)
    assert run is not None
    return run
