"""People in the loop from Kubernetes: a Waiting AgentRun lists its pending calls and announces each,
`spec.decisions` decides them through the store as the API does, and the answer lands in the status."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolContext, tool
from tests.support.builders import SimulatedCrash, worker
from tests.support.cluster import Cluster, uid_of
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("operator")

ran: list[str] = []


@tool(name="deploy", description="Deploys.", requires_approval=True)
async def deploy(args: dict[str, Any], ctx: ToolContext) -> str:
    ran.append(ctx.tool_use_id)
    return "deployed"


async def _run_id(store: RunStore, obj: dict[str, Any]) -> Any:
    uid = uid_of(obj)

    async def exists() -> bool:
        return await store.get(uid) is not None

    await eventually(exists, 60, "the run row")
    return uid


async def test_a_waiting_agentrun_is_decided_through_spec_decisions(cluster: Cluster, store: RunStore) -> None:
    ran.clear()
    obj = await cluster.create("ship-it", input="ship it")
    run_id = await _run_id(store, obj)
    llm = ScriptedLlm().then_tool_use("t_deploy", "deploy", {"env": "prod"}, 10, 5).then_text("shipped", 10, 5)
    await worker(store, llm, [deploy]).run_once()  # parks the run: deploy needs approval
    status = await cluster.wait_status("ship-it", "Waiting", lambda s: s.get("phase") == "Waiting")
    [pending] = status["pending"]
    assert (pending["toolUseId"], pending["tool"], pending["kind"]) == ("t_deploy", "deploy", "approval")
    assert '"env":"prod"' in pending["input"]
    assert "waiting for 1 decision" in status["message"]

    async def announced() -> bool:
        return any(e["reason"] == "DecisionRequired" for e in cluster.events("ship-it"))

    await eventually(announced, 60, "the DecisionRequired Event")
    [event] = [e for e in cluster.events("ship-it") if e["reason"] == "DecisionRequired"]
    assert "t_deploy" in event["message"] and "deploy" in event["message"]

    await cluster.patch_spec("ship-it", decisions=[{"toolUseId": "t_deploy", "decision": "approve",
                                                     "reason": "change ticket 42"}])

    async def queued() -> bool:
        run = await store.get(run_id)
        return run is not None and run.status.value == "QUEUED"

    await eventually(queued, 60, "the decision to queue the run again")
    [call] = await store.decisions(run_id)
    assert call.decision is not None and call.decision.value == "approve" and call.reason == "change ticket 42"
    assert call.decided_by is not None and call.decided_by.startswith("k8s")
    await worker(store, llm, [deploy]).run_once()
    status = await cluster.wait_status("ship-it", "Succeeded", lambda s: s.get("phase") == "Succeeded")
    assert status["output"] == "shipped" and status["outputTruncated"] is False and status["pending"] == []
    assert ran == ["t_deploy"]


async def test_a_decision_that_does_not_fit_is_an_event_not_a_change(cluster: Cluster, store: RunStore) -> None:
    obj = await cluster.create("unsure", input="ship it")
    run_id = await _run_id(store, obj)
    llm = ScriptedLlm().then_tool_use("t_deploy", "deploy", {}, 10, 5).then_text("shipped")
    await worker(store, llm, [deploy]).run_once()
    await cluster.wait_status("unsure", "Waiting", lambda s: s.get("phase") == "Waiting")
    await cluster.patch_spec("unsure", decisions=[{"toolUseId": "t_deploy", "decision": "retry"}])

    async def rejected() -> bool:
        return any(e["reason"] == "DecisionRejected" for e in cluster.events("unsure"))

    await eventually(rejected, 60, "the DecisionRejected Event")
    [call] = await store.decisions(run_id)
    assert call.decision is None


async def test_a_long_answer_is_cut_to_4_kib_in_the_status(cluster: Cluster, store: RunStore) -> None:
    obj = await cluster.create("chatty", input="talk")
    await _run_id(store, obj)
    await worker(store, ScriptedLlm().then_text("é" * 5000, 10, 5)).run_once()
    status = await cluster.wait_status("chatty", "Succeeded", lambda s: s.get("phase") == "Succeeded")
    assert status["outputTruncated"] is True and len(status["output"].encode()) <= 4096


async def test_record_without_output_is_refused_by_the_crd(cluster: Cluster) -> None:
    await cluster.create("strict", input="go")
    with pytest.raises(Exception, match="record needs output"):
        await cluster.patch_spec("strict", decisions=[{"toolUseId": "t", "decision": "record"}])


async def test_spec_continue_from_goes_on_with_a_succeeded_agentrun(cluster: Cluster, store: RunStore) -> None:
    first = await cluster.create("chat-1", input="first question")
    await _run_id(store, first)
    llm = ScriptedLlm().then_text("first answer", 10, 5).then_text("second answer", 10, 5)
    await worker(store, llm).run_once()
    await cluster.wait_status("chat-1", "Succeeded", lambda s: s.get("phase") == "Succeeded")
    second = await cluster.create("chat-2", input="second question", continueFrom="chat-1")
    run_id = await _run_id(store, second)
    await worker(store, llm).run_once()
    status = await cluster.wait_status("chat-2", "Succeeded", lambda s: s.get("phase") == "Succeeded")
    assert status["output"] == "second answer"
    run = await store.get(run_id)
    assert run is not None and run.parent_run_id == uid_of(first)
    assert [m["role"] for m in llm.seen[-1].messages] == ["user", "assistant", "user"]


async def test_spec_fork_from_a_step_that_does_not_exist_is_rejected(cluster: Cluster, store: RunStore) -> None:
    first = await cluster.create("src", input="q")
    await _run_id(store, first)
    await worker(store, ScriptedLlm().then_text("a")).run_once()
    await cluster.wait_status("src", "Succeeded", lambda s: s.get("phase") == "Succeeded")
    await cluster.create("bad-fork", forkFrom={"name": "src", "seq": 5})
    status = await cluster.wait_status("bad-fork", "Failed", lambda s: s.get("phase") == "Failed")
    assert "forkFrom.seq" in status["message"]


async def test_spec_fork_from_an_agentrun_whose_call_was_in_doubt_asks_again(
    cluster: Cluster, store: RunStore, db: Any
) -> None:
    """The fork inherits the call in doubt (the same store path as the API's forkFrom): it waits in the
    child, announced, instead of being made again."""
    paid: list[str] = []

    @tool(name="pay", description="Pays, once.", idempotent=False)
    async def pay(args: dict[str, Any], ctx: ToolContext) -> str:
        paid.append(ctx.tool_use_id)
        if len(paid) == 1:
            raise SimulatedCrash()
        return "paid"

    src = await cluster.create("pay-src", input="pay")
    src_id = await _run_id(store, src)
    llm = ScriptedLlm().then_tool_use("t_pay", "pay", {}, 10, 5).then_text("done", 10, 5)
    with pytest.raises(SimulatedCrash):
        await worker(store, llm, [pay], "worker-A").run_once()
    await db.execute("UPDATE run SET locked_until = now() - interval '1 second' WHERE id = %s", (src_id,))
    await worker(store, llm, [pay], "worker-B").run_once()  # parks it in doubt
    await cluster.wait_status("pay-src", "Waiting", lambda s: s.get("phase") == "Waiting")
    await cluster.patch_spec("pay-src", decisions=[{"toolUseId": "t_pay", "decision": "fail"}])

    async def queued() -> bool:
        run = await store.get(src_id)
        return run is not None and run.status.value == "QUEUED"

    await eventually(queued, 60, "the decision to queue the run again")
    await worker(store, llm, [pay], "worker-B").run_once()  # ends it FAILED, as the person chose
    await cluster.wait_status("pay-src", "Failed", lambda s: s.get("phase") == "Failed")
    child = await cluster.create("pay-fork", forkFrom={"name": "pay-src", "seq": 2})
    await _run_id(store, child)
    await worker(store, llm, [pay], "worker-C").run_once()
    status = await cluster.wait_status("pay-fork", "Waiting", lambda s: s.get("phase") in ("Waiting", "Succeeded"))
    assert status["phase"] == "Waiting" and paid == ["t_pay"]
    [pending] = status["pending"]
    assert (pending["toolUseId"], pending["kind"], pending["attempt"]) == ("t_pay", "in_doubt", 1)
