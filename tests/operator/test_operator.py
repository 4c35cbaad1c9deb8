"""The real kopf operator against an emulated API server and a real PostgreSQL, end to end."""

from __future__ import annotations

import pytest

from agentrun.worker.core.records import RunStatus
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from tests.support.builders import worker
from tests.support.cluster import Cluster, assert_events_precede_their_phase, run_row, uid_of
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("operator")


async def test_agentrun_becomes_a_run_and_reports_success(cluster: Cluster, store: RunStore) -> None:
    obj = await cluster.create("hello", input="Say hello")
    run = await run_row(store, obj)
    assert (run.k8s_namespace, run.k8s_name, run.input) == ("default", "hello", "Say hello")
    assert (run.model, run.max_steps) == ("claude-sonnet-4-6", 100)  # the CRD's defaults
    await cluster.wait_status("hello", "Queued", lambda s: s.get("phase") == "Queued")

    w = worker(store, ScriptedLlm().then_text("hello, hola, hallo", in_=10, out=5))
    assert await w.run_once() == run.id

    status = await cluster.wait_status("hello", "Succeeded", lambda s: s.get("phase") == "Succeeded")
    assert status["runId"] == str(run.id)
    assert status["tokensUsed"] == 15 and status["steps"] == 1
    assert status["lockedBy"] == "worker-A" and status["finishedAt"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Succeeded"]["status"] == "True" and conditions["Ready"]["status"] == "True"
    # No waiting: an Event is posted before the status shows its phase, and every phase passed through
    # is announced once, whether or not the operator looked while the run was Running.
    assert [e["reason"] for e in cluster.events("hello")] == ["Queued", "Running", "Succeeded"]
    assert_events_precede_their_phase(cluster, "hello")


async def test_failed_run_reports_its_reason(cluster: Cluster, store: RunStore) -> None:
    obj = await cluster.create("broken", input="go")
    await run_row(store, obj)
    w = worker(store, ScriptedLlm())  # no scripted answer: the model call fails for good
    await w.run_once()
    status = await cluster.wait_status("broken", "Failed", lambda s: s.get("phase") == "Failed")
    assert "no more responses" in status["message"]

    async def failed_event_posted() -> bool:  # the Event follows the status patch, not with it
        return any(e["reason"] == "Failed" for e in cluster.events("broken"))

    await eventually(failed_event_posted, what="the Failed event")
    failed = [e for e in cluster.events("broken") if e["reason"] == "Failed"]
    assert failed[0]["type"] == "Warning" and "no more responses" in failed[0]["message"]


async def test_spec_cancel_cancels_the_run(cluster: Cluster, store: RunStore) -> None:
    obj = await cluster.create("stop-me", input="go")
    run = await run_row(store, obj)
    await cluster.patch_spec("stop-me", cancel=True)
    status = await cluster.wait_status("stop-me", "Cancelled", lambda s: s.get("phase") == "Cancelled")
    assert status["finishedAt"]
    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.CANCELLED and after.cancel_requested


async def test_deleting_cancels_an_unfinished_run_and_keeps_its_rows(cluster: Cluster, store: RunStore) -> None:
    obj = await cluster.create("doomed", input="go")
    run = await run_row(store, obj)
    await cluster.wait_status("doomed", "Queued", lambda s: s.get("phase") == "Queued")
    assert "agentrun.dev/finalizer" in ((await cluster.get("doomed")) or {})["metadata"].get("finalizers", [])
    await cluster.delete("doomed")

    async def gone() -> bool:
        return await cluster.get("doomed") is None

    await eventually(gone, 60, "the AgentRun to be deleted")
    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.CANCELLED  # the row stays for audit


async def test_unknown_tool_fails_without_a_run(cluster: Cluster, store: RunStore) -> None:
    obj = await cluster.create("bad-tools", input="go", tools=["lookup", "teleport"])
    status = await cluster.wait_status("bad-tools", "Failed", lambda s: s.get("phase") == "Failed")
    assert "teleport" in status["message"] and "lookup" not in status["message"].split("(")[0]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["reason"] == "InvalidSpec"
    assert await store.get(uid_of(obj)) is None
    assert any(e["reason"] == "InvalidSpec" for e in cluster.events("bad-tools"))


async def test_known_tools_and_budgets_reach_the_run(cluster: Cluster, store: RunStore) -> None:
    obj = await cluster.create("budgeted", input="go", tools=["lookup"], tokenBudget=5000, timeoutSeconds=30,
                               maxSteps=7, costBudgetUsd=0.25, system="be brief", model="claude-haiku-4-5")
    run = await run_row(store, obj)
    assert run.tools == ("lookup",) and run.token_budget == 5000 and run.timeout_seconds == 30
    assert run.max_steps == 7 and str(run.cost_budget_usd) == "0.250000" and run.system == "be brief"
    assert run.model == "claude-haiku-4-5"


async def test_ttl_deletes_a_finished_agentrun(cluster: Cluster, store: RunStore) -> None:
    obj = await cluster.create("short-lived", input="go", ttlSecondsAfterFinished=0)
    run = await run_row(store, obj)
    await worker(store, ScriptedLlm().then_text("done")).run_once()

    async def gone() -> bool:
        return await cluster.get("short-lived") is None

    await eventually(gone, 60, "the finished AgentRun to be deleted")
    after = await store.get(run.id)
    assert after is not None and after.status is RunStatus.SUCCEEDED


async def test_cost_budget_on_an_unpriced_model_fails_without_a_run(cluster: Cluster, store: RunStore) -> None:
    """No worker could enforce it (an unpriced step costs null): refused, not accepted and never stopped."""
    obj = await cluster.create("unpriced", input="go", model="claude-imaginary-9", costBudgetUsd=0.5)
    status = await cluster.wait_status("unpriced", "Failed", lambda s: s.get("phase") == "Failed")
    assert "costBudgetUsd" in status["message"] and "claude-imaginary-9" in status["message"]
    assert "no price" in status["message"]
    assert {c["type"]: c for c in status["conditions"]}["Ready"]["reason"] == "InvalidSpec"
    assert await store.get(uid_of(obj)) is None
    # Without a budget the same model is fine: its cost is just unknown.
    await cluster.create("unpriced-no-budget", input="go", model="claude-imaginary-9")
    await cluster.wait_status("unpriced-no-budget", "Queued", lambda s: s.get("phase") == "Queued")
