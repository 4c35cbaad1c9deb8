"""Every phase an AgentRun's run goes through is announced by an Event, however fast it goes."""

from __future__ import annotations

from agentrun.worker.llm.scripted import ScriptedLlm
from agentrun.worker.store import RunStore
from tests.helpers import eventually, worker
from tests.operator.conftest import Cluster, assert_events_precede_their_phase, operator_running, settings_for, uid_of


async def test_a_run_that_finished_unseen_announces_each_phase(
    cluster: Cluster, store: RunStore, database_url: str
) -> None:
    """The operator last saw it Queued; it ran and succeeded while no operator was looking."""
    async with operator_running(cluster, settings_for(database_url)):
        obj = await cluster.create("quick", input="go")
        await cluster.wait_status("quick", "Queued", lambda s: s.get("phase") == "Queued")

    async def has_row() -> bool:
        return await store.get(uid_of(obj)) is not None

    await eventually(has_row, 10, "the run row")
    await worker(store, ScriptedLlm().then_text("done")).run_once()

    async with operator_running(cluster, settings_for(database_url)):
        status = await cluster.wait_status("quick", "Succeeded", lambda s: s.get("phase") == "Succeeded")
        assert status["lockedBy"] == "worker-A"
        events = cluster.events("quick")
        assert [e["reason"] for e in events] == ["Queued", "Running", "Succeeded"]
        assert events[1]["message"] == "running on worker-A"
        assert_events_precede_their_phase(cluster, "quick")
