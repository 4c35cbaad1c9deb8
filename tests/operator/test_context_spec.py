"""AgentRun.spec.contextManagement (and Agent.spec.contextManagement): the CRD's schema refuses what is no
policy, the operator maps it onto the run (checked as the REST API checks it), and it stays as created."""

from __future__ import annotations

import pytest

from agentrun.operator import mapping
from agentrun.worker.store import RunStore
from tests.support.cluster import NAMESPACE, PATH, Cluster, assert_invalid, run_row
from tests.support.waiting import eventually

UID = "6f1c0a52-1111-2222-3333-444455556666"
POLICY = {"strategy": "summarize", "keepRecentTurns": 3, "triggerTokens": 120_000}


def _body(name: str, **spec: object) -> dict[str, object]:
    return {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun",
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": {"input": "go", **spec}}


def test_the_mapping_stores_the_policy_with_every_field() -> None:
    new = mapping.new_run({"input": "hi", "contextManagement": {"strategy": "clear_tool_results"}}, UID, "ns", "a")
    assert new.context_management == {"strategy": "clear_tool_results", "keepRecentTurns": 2}
    assert mapping.new_run({"input": "hi"}, UID, "ns", "a").context_management is None


@pytest.mark.parametrize(("value", "words"), [
    ({"strategy": "fold"}, "spec.contextManagement.strategy"),
    ({"keepRecentTurns": -1}, "spec.contextManagement.keepRecentTurns"),
    ({"triggerTokens": True}, "spec.contextManagement.triggerTokens"),
    ("summarize", "spec.contextManagement must be an object"),
])
def test_the_mapping_refuses_what_reached_it_without_the_schema(value: object, words: str) -> None:
    with pytest.raises(mapping.InvalidSpec, match=words.replace(".", r"\.")):
        mapping.new_run({"input": "hi", "contextManagement": value}, UID, "ns", "a")


def test_an_agents_policy_is_part_of_its_definition() -> None:
    agent = mapping.agent_definition("reader", {"contextManagement": {"strategy": "none"}})
    assert agent.context_management == {"strategy": "none", "keepRecentTurns": 2}


@pytest.mark.usefixtures("operator")
async def test_spec_context_management_reaches_the_run(cluster: Cluster, store: RunStore) -> None:
    obj = await cluster.create("long", input="go", contextManagement=POLICY)
    assert (await run_row(store, obj)).context_management == POLICY


@pytest.mark.parametrize(("value", "words"), [
    ({"strategy": "fold"}, "spec.contextManagement.strategy"),
    ({"strategy": "summarize", "keepRecentTurns": -1}, "spec.contextManagement.keepRecentTurns"),
    ({"triggerTokens": 0}, "spec.contextManagement.triggerTokens"),
    ({"triggerTokens": "many"}, "spec.contextManagement.triggerTokens"),
])
async def test_the_crd_refuses_what_is_no_policy(cluster: Cluster, value: dict[str, object], words: str) -> None:
    assert_invalid(await cluster.http.post(PATH, json=_body("bad", contextManagement=value)), words)


async def test_spec_context_management_is_immutable(cluster: Cluster) -> None:
    r = await cluster.http.post(PATH, json=_body("fixed", contextManagement=POLICY))
    assert r.status_code == 201, r.text
    r = await cluster.http.patch(f"{PATH}/fixed", json={"spec": {"contextManagement": {"strategy": "none"}}},
                                 headers={"Content-Type": "application/merge-patch+json"})
    assert_invalid(r, "contextManagement is immutable")


@pytest.mark.usefixtures("operator")
async def test_an_agents_spec_context_management_is_its_runs(cluster: Cluster, store: RunStore) -> None:
    await cluster.create_agent("reader", contextManagement={"strategy": "clear_tool_results"}, tokenBudget=1000)

    async def stored() -> bool:
        agent = await store.agent("reader")
        return agent is not None and agent.context_management is not None

    await eventually(stored, 60, "the agent stored with its contextManagement")
    obj = await cluster.create("of-agent", agentRef={"name": "reader"}, input="x")
    assert (await run_row(store, obj)).context_management == {"strategy": "clear_tool_results", "keepRecentTurns": 2}
