"""The scoped door for reads (store/scoped.py): in a scope that sees a run, each read is the store's own; a
run the scope does not see, or that does not exist, reads as no run (None), never as an empty list."""

from __future__ import annotations

import uuid

from agentrun.worker.core.viewer import Viewer
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from tests.support.builders import new_run, worker

PER_RUN = ("steps", "timeline", "decisions", "messages", "children", "webhooks_of")


async def test_a_caller_in_scope_reads_what_the_store_reads(store: RunStore) -> None:
    run, _ = await store.create(new_run())
    await worker(store, ScriptedLlm().then_text("done", 10, 5)).run_once()
    reads = store.scoped(Viewer(identity="alice"))
    assert await reads.get(run.id) == await store.get(run.id)
    assert await reads.sees(run.id)
    for name in PER_RUN:
        assert await getattr(reads, name)(run.id) == await getattr(store, name)(run.id), name
    assert await reads.step(run.id, 1) == await store.step(run.id, 1)
    assert await reads.steps_before(run.id, 2) == await store.steps_before(run.id, 2)
    assert await reads.pending_wait(run.id) is None
    assert [r.id for r in await reads.list_runs()] == [r.id for r in await store.list_runs()]


async def test_a_run_that_is_not_there_reads_as_none(store: RunStore) -> None:
    reads = store.scoped(Viewer(identity="alice"))
    nobody = uuid.uuid4()
    assert await reads.get(nobody) is None and not await reads.sees(nobody)
    for name in PER_RUN:
        assert await getattr(reads, name)(nobody) is None, name
    assert await reads.step(nobody, 1) is None
    assert await reads.steps_before(nobody, 1) is None


async def test_a_run_is_looked_up_once_per_reader(store: RunStore) -> None:
    """One reader serves one request: the run's visibility is read by its first read, not by every one."""
    run, _ = await store.create(new_run())
    reads = store.scoped(Viewer(identity="alice"))
    looked: list[str] = []
    real = reads._run_row

    async def counted(query: str, run_id: uuid.UUID) -> object:
        looked.append(query)
        return await real(query, run_id)

    reads._run_row = counted  # type: ignore[method-assign]
    assert await reads.timeline(run.id) == [] and await reads.decisions(run.id) == []
    assert await reads.messages(run.id) == [] and await reads.sees(run.id)
    assert len(looked) == 1
    assert await reads.get(run.id) is not None and len(looked) == 2  # a get reads the run itself
    nobody = uuid.uuid4()
    assert await reads.steps(nobody) is None and await reads.steps(nobody) is None
    assert len(looked) == 4  # a run not seen is looked up again: it may have been made meanwhile
