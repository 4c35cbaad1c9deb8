"""Agent resources: the CRD's schema, the mapping to agent definitions, and the real operator storing
them as versions in PostgreSQL (emulated API server); AgentRuns naming one with spec.agentRef."""

from __future__ import annotations

import pathlib
from decimal import Decimal
from typing import Any

import pytest
import yaml

from agentrun.operator import mapping
from agentrun.worker.core.agents import Agent
from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from tests.support.builders import worker
from tests.support.cluster import Cluster, agents_path, assert_invalid, operator_running, run_row, settings_for, uid_of
from tests.support.waiting import eventually

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "agent.yaml"

RESEARCHER = {"description": "Finds facts.", "system": "You research.", "model": "claude-haiku-4-5",
              "tools": ["lookup"], "tokenBudget": 5000, "timeoutSeconds": 120, "maxSteps": 7,
              "costBudgetUsd": 0.5}


def _version() -> dict[str, Any]:
    (version,) = yaml.safe_load(CRD.read_text())["spec"]["versions"]
    return version  # type: ignore[no-any-return]


def _has_version(n: int) -> Any:
    return lambda s: s.get("version") == n and (s.get("conditions") or [{}])[0].get("status") == "True"


# -- the CRD --------------------------------------------------------------------------------------


def test_crd_names_columns_and_status() -> None:
    crd = yaml.safe_load(CRD.read_text())
    assert crd["metadata"]["name"] == "agents.agentrun.dev"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == ("Agent", "agents", ["ag"])
    version = _version()
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = {c["name"]: (c["jsonPath"], c.get("priority", 0)) for c in version["additionalPrinterColumns"]}
    assert columns == {"Model": (".spec.model", 0), "Version": (".status.version", 0), "Tools": (".spec.tools", 0),
                       "Age": (".metadata.creationTimestamp", 0), "Message": (".status.message", 1)}
    schema = version["schema"]["openAPIV3Schema"]
    assert set(schema["properties"]["spec"]["properties"]) == {
        "description", "system", "model", "tools", "requireApproval", "outputSchema", "maxSteps", "tokenBudget",
        "costBudgetUsd", "timeoutSeconds", "subAgents", "webhook", "contextManagement"}
    assert {"version", "observedGeneration", "message", "conditions"} <= set(schema["properties"]["status"]["properties"])


def test_the_agent_crd_bounds_match_the_agentrun_crd() -> None:
    """A field an Agent gives and a run may lower has the same type and bounds in both kinds."""
    run = yaml.safe_load((ROOT / "crds" / "agentrun.yaml").read_text())["spec"]["versions"][0]
    runs = run["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    agents = _version()["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    for field in mapping.AGENT_FIELDS:
        for key in ("type", "minimum", "maximum", "exclusiveMinimum", "maxLength", "minLength", "maxItems", "items"):
            assert agents[field].get(key) == runs[field].get(key), (field, key)


def _agent(spec: dict[str, Any], name: str = "researcher") -> dict[str, Any]:
    return {"apiVersion": "agentrun.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name}, "spec": spec}


async def test_a_full_agent_is_accepted(cluster: Cluster) -> None:
    spec = {**RESEARCHER, "requireApproval": ["*"], "subAgents": ["writer", "critic@2"],
            "outputSchema": {"type": "object", "properties": {"answer": {"type": "string"}}}}
    r = await cluster.http.post(agents_path(), json=_agent(spec))
    assert r.status_code == 201, r.text
    assert r.json()["spec"] == spec  # no defaults: what the agent leaves out, a run (or the runtime) gives


@pytest.mark.parametrize(
    "spec, name, words",
    [
        ({}, "Researcher", ["metadata.name is the agent's name: a DNS label"]),
        ({}, "re.searcher", ["a DNS label"]),
        ({"description": ""}, "a", ["spec.description", "at least 1 chars"]),
        ({"model": ""}, "a", ["spec.model"]),
        ({"system": "x" * 100_001}, "a", ["spec.system", "Too long"]),
        ({"tools": ["a", "a"]}, "a", ["spec.tools[1]", "Duplicate value"]),
        ({"tools": ["bad name"]}, "a", ["spec.tools[0]", "should match"]),
        ({"requireApproval": ["x y"]}, "a", ["spec.requireApproval[0]"]),
        ({"outputSchema": "a string"}, "a", ["spec.outputSchema", "must be of type object"]),
        ({"outputSchema": ["type"]}, "a", ["spec.outputSchema", "must be of type object"]),
        ({"maxSteps": 0}, "a", ["spec.maxSteps"]),
        ({"maxSteps": 10_001}, "a", ["spec.maxSteps"]),
        ({"tokenBudget": 100_000_001}, "a", ["spec.tokenBudget"]),
        ({"costBudgetUsd": 0}, "a", ["spec.costBudgetUsd", "greater than 0"]),
        ({"timeoutSeconds": 604_801}, "a", ["spec.timeoutSeconds"]),
        ({"subAgents": ["Writer"]}, "a", ["spec.subAgents[0]", "should match"]),
        ({"subAgents": ["writer@0"]}, "a", ["spec.subAgents[0]", "should match"]),
        ({"subAgents": ["writer", "writer"]}, "a", ["spec.subAgents[1]", "Duplicate value"]),
        ({"subAgents": [f"a{i}" for i in range(33)]}, "a", ["spec.subAgents", "Too many"]),
    ],
    ids=repr,
)
async def test_the_schema_refuses_bad_agents(cluster: Cluster, spec: dict[str, Any], name: str, words: list[str]) -> None:
    r = await cluster.http.post(agents_path(), json=_agent(spec, name))
    assert_invalid(r, f'Agent.agentrun.dev "{name}" is invalid', *words)
    assert await cluster.get_agent(name) is None


async def test_every_field_of_an_agent_may_change(cluster: Cluster) -> None:
    assert (await cluster.http.post(agents_path(), json=_agent(RESEARCHER))).status_code == 201
    await cluster.patch_agent("researcher", {"model": "claude-sonnet-4-6", "tools": None, "subAgents": ["writer"]})
    spec = ((await cluster.get_agent("researcher")) or {})["spec"]
    assert spec["model"] == "claude-sonnet-4-6" and "tools" not in spec and spec["subAgents"] == ["writer"]


# -- the mapping ----------------------------------------------------------------------------------


def test_an_agent_spec_is_a_definition() -> None:
    agent = mapping.agent_definition("researcher", {**RESEARCHER, "subAgents": ["writer", "critic@2", "writer"]},
                                     known_tools={"lookup"})
    assert (agent.name, agent.description, agent.system, agent.model) == (
        "researcher", "Finds facts.", "You research.", "claude-haiku-4-5")
    assert (agent.tools, agent.token_budget, agent.timeout_seconds, agent.max_steps) == (("lookup",), 5000, 120, 7)
    assert agent.cost_budget_usd == Decimal("0.5") and agent.sub_agents == ("writer", "critic@2")
    empty = mapping.agent_definition("plain", {})
    assert (empty.model, empty.token_budget, empty.tools, empty.sub_agents) == (None, None, None, None)


@pytest.mark.parametrize("name, spec, words", [
    ("Bad_Name", {}, "metadata.name"),
    ("a", {"tools": ["teleport"]}, "unknown tools: teleport (the workers offer: lookup)"),
    ("a", {"requireApproval": ["teleport"]}, "spec.requireApproval names unknown tools: teleport"),
    ("a", {"outputSchema": {"type": "no-such-type"}}, "spec.outputSchema"),
    ("a", {"description": "  "}, "spec.description must be a non-empty string"),
    ("a", {"system": "nul \x00"}, "spec.system"),
    ("a", {"model": "m", "costBudgetUsd": 1}, "costBudgetUsd"),
    ("a", {"subAgents": ["x@y"]}, "spec.subAgents[0]"),
    ("a", {"maxSteps": True}, "spec.maxSteps"),
    ("a", {"subAgents": ["b", "a@2"]}, "spec.subAgents[1] names the agent itself"),
])
def test_agent_specs_the_runtime_cannot_use(name: str, spec: dict[str, Any], words: str) -> None:
    with pytest.raises(mapping.InvalidSpec, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        mapping.agent_definition(name, spec, known_tools={"lookup"}, prices=PriceTable.load())


def test_the_owner_of_an_agent_is_the_namespace_in_created_by() -> None:
    assert mapping.agent_owner("k8s:team-a/kubectl-client-side-apply") == "team-a"
    assert mapping.agent_owner("k8s:team-a") == "team-a"
    assert mapping.agent_owner("alice") is None and mapping.agent_owner(None) is None
    assert mapping.agent_creator({"metadata": {"namespace": "team-b"}}) == "k8s:team-b"


def test_agent_ref_is_checked_as_the_crd_checks_it() -> None:
    assert mapping.agent_ref({"agentRef": {"name": "researcher"}}) == ("researcher", None)
    assert mapping.agent_ref({"agentRef": {"name": "researcher", "version": 3}}) == ("researcher", 3)
    assert mapping.agent_ref({}) is None
    for bad in ({"name": "Bad"}, {"name": "ok", "version": 0}, {"name": "ok", "version": True}, "researcher"):
        with pytest.raises(mapping.InvalidSpec, match="spec.agentRef"):
            mapping.agent_ref({"agentRef": bad})


# -- the operator ---------------------------------------------------------------------------------


@pytest.mark.usefixtures("operator")
async def test_each_change_of_spec_is_a_version_and_deleting_refuses_new_runs(cluster: Cluster, store: RunStore) -> None:
    await cluster.create_agent("researcher", **RESEARCHER)
    status = await cluster.wait_agent("researcher", "version 1", _has_version(1))
    assert status["observedGeneration"] == 1 and status["message"] == "version 1 stored"
    stored = await store.agent("researcher")
    assert stored is not None and stored.version == 1
    assert (stored.system, stored.model, stored.tools, stored.token_budget) == (
        "You research.", "claude-haiku-4-5", ("lookup",), 5000)
    assert stored.created_by is not None and mapping.agent_owner(stored.created_by) == "default"

    await cluster.patch_agent("researcher", {"system": "You research thoroughly."})
    status = await cluster.wait_agent("researcher", "version 2", _has_version(2))
    assert status["observedGeneration"] == 2
    assert [a.version for a in await store.agent_versions("researcher")] == [1, 2]
    assert ((await store.agent("researcher", 1)) or stored).system == "You research."  # kept for pinned runs

    # A change that is no change of the definition (a label) makes no version.
    r = await cluster.http.patch(f"{agents_path()}/researcher", json={"metadata": {"labels": {"team": "a"}}},
                                 headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 200, r.text
    await cluster.create("probe", agentRef={"name": "researcher"}, input="x")
    await cluster.wait_status("probe", "queued", lambda s: s.get("phase") == "Queued")  # handlers have caught up
    assert [a.version for a in await store.agent_versions("researcher")] == [1, 2]

    await cluster.delete_agent("researcher")

    async def gone() -> bool:
        return await cluster.get_agent("researcher") is None and await store.agent("researcher") is None

    await eventually(gone, 60, "the Agent and its definition deleted")
    assert await store.agent("researcher", deleted=True) is not None  # its versions stay for pinned runs
    await cluster.create("late", agentRef={"name": "researcher"}, input="x")
    status = await cluster.wait_status("late", "Failed", lambda s: s.get("phase") == "Failed")
    assert "spec.agentRef" in status["message"] and "no agent 'researcher'" in status["message"]

    # Defined again: undeleted, as a new version since its spec differs from the last one stored.
    await cluster.create_agent("researcher", **RESEARCHER)
    await cluster.wait_agent("researcher", "version 3", _has_version(3))
    assert ((await store.agent("researcher")) or stored).version == 3


async def test_an_operator_restart_stores_no_new_version(cluster: Cluster, store: RunStore, database_url: str) -> None:
    settings = settings_for(database_url)
    async with operator_running(cluster, settings):
        await cluster.create_agent("researcher", **RESEARCHER)
        await cluster.wait_agent("researcher", "version 1", _has_version(1))
        await cluster.patch_agent("researcher", {"maxSteps": 9})
        await cluster.wait_agent("researcher", "version 2", _has_version(2))
    # Changed while no operator ran: stored when the next one starts; unchanged ones make no version.
    await cluster.create_agent("writer", system="You write.")
    async with operator_running(cluster, settings):
        await cluster.wait_agent("writer", "version 1", _has_version(1))
        status = await cluster.wait_agent("researcher", "resumed",
                                          lambda s: s.get("message") == "version 2 stored already (the spec is unchanged)")
        assert status["version"] == 2
    assert [a.version for a in await store.agent_versions("researcher")] == [1, 2]


@pytest.mark.usefixtures("operator")
async def test_an_agentrun_with_agent_ref_runs_the_agent(cluster: Cluster, store: RunStore) -> None:
    await cluster.create_agent("researcher", **RESEARCHER)
    await cluster.wait_agent("researcher", "version 1", _has_version(1))
    await cluster.patch_agent("researcher", {"system": "Version two.", "tokenBudget": 8000})
    await cluster.wait_agent("researcher", "version 2", _has_version(2))

    latest = await cluster.create("ask", agentRef={"name": "researcher"}, input="Tallest Alp?", maxSteps=5)
    run = await run_row(store, latest)
    assert (run.agent, run.agent_version, run.system, run.model) == ("researcher", 2, "Version two.", "claude-haiku-4-5")
    assert (run.tools, run.token_budget, run.timeout_seconds, run.max_steps) == (("lookup",), 8000, 120, 5)
    assert run.cost_budget_usd == Decimal("0.5")

    pinned = await cluster.create("ask-v1", agentRef={"name": "researcher", "version": 1}, input="Tallest Alp?")
    run1 = await run_row(store, pinned)
    assert (run1.agent_version, run1.system, run1.token_budget, run1.max_steps) == (1, "You research.", 5000, 7)

    assert await worker(store, ScriptedLlm().then_text("Mont Blanc", in_=10, out=5)).run_once() in (run.id, run1.id)
    assert await worker(store, ScriptedLlm().then_text("Mont Blanc", in_=10, out=5)).run_once() in (run.id, run1.id)
    status = await cluster.wait_status("ask", "Succeeded", lambda s: s.get("phase") == "Succeeded")
    assert status["agent"] == "researcher@2" and status["output"] == "Mont Blanc"
    assert (await cluster.wait_status("ask-v1", "Succeeded", lambda s: s.get("phase") == "Succeeded"))["agent"] == (
        "researcher@1")


@pytest.mark.usefixtures("operator")
async def test_agent_refs_that_make_no_run_fail_the_agentrun(cluster: Cluster, store: RunStore) -> None:
    await cluster.create_agent("researcher", **RESEARCHER)
    await cluster.wait_agent("researcher", "version 1", _has_version(1))
    cases = {
        "unknown": ({"agentRef": {"name": "nobody"}}, "spec.agentRef no agent 'nobody'"),
        "no-version": ({"agentRef": {"name": "researcher", "version": 9}}, "no version 9 of agent 'researcher'"),
        "raised": ({"agentRef": {"name": "researcher"}, "tokenBudget": 6000},
                   "spec.tokenBudget may only lower agent researcher@1's 5000"),
    }
    for name, (spec, _) in cases.items():
        await cluster.create(name, input="x", **spec)
    for name, (_, words) in cases.items():
        status = await cluster.wait_status(name, "Failed", lambda s: s.get("phase") == "Failed")
        assert words in status["message"], status
        assert "runId" not in status and await store.get(uid_of((await cluster.get(name)) or {})) is None


@pytest.mark.usefixtures("operator")
async def test_a_bad_agent_spec_stores_no_version_and_says_why(cluster: Cluster, store: RunStore) -> None:
    await cluster.create_agent("tools", tools=["teleport"])
    await cluster.create_agent("subs", subAgents=["nobody"])
    await cluster.create_agent("schema", outputSchema={"type": "no-such-type"})
    for name, words in [("tools", "unknown tools: teleport (the workers offer: lookup)"),
                        ("subs", "spec.subAgents[0]: no agent 'nobody'"), ("schema", "spec.outputSchema")]:
        status = await cluster.wait_agent(name, "refused", lambda s: bool(s.get("message")))
        assert words in status["message"] and "version" not in status, status
        assert status["conditions"][0]["status"] == "False" and status["conditions"][0]["reason"] == "InvalidSpec"
        assert await store.agent(name) is None

    # Fixed: stored. A bad edit after it keeps the version runs get, and says so.
    await cluster.patch_agent("tools", {"tools": ["lookup"]})
    await cluster.wait_agent("tools", "version 1", _has_version(1))
    await cluster.patch_agent("tools", {"tools": ["lookup", "teleport"]})
    status = await cluster.wait_agent("tools", "refused", lambda s: s.get("conditions", [{}])[0].get("status") == "False")
    assert status["version"] == 1 and "runs naming it still get version 1" in status["message"]
    assert [a.version for a in await store.agent_versions("tools")] == [1]


async def test_one_agent_name_per_tenant_the_first_namespace_keeps_it(
    cluster: Cluster, store: RunStore, database_url: str,
) -> None:
    # Two namespaces of one tenant share its agent names.
    async with operator_running(cluster, settings_for(database_url, namespace_tenants={"team-b": "default"})):
        await cluster.create_agent("researcher", **RESEARCHER)
        await cluster.wait_agent("researcher", "version 1", _has_version(1))
        await cluster.create_agent("researcher", namespace="team-b", system="Another team's agent.")
        status = await cluster.wait_agent("researcher", "conflict", lambda s: bool(s.get("message")),
                                          namespace="team-b")
        assert "taken by the Agent in namespace 'default'" in status["message"] and "version" not in status
        assert status["conditions"][0]["reason"] == "NameConflict"
        # Deleting the other namespace's Agent leaves the definition alone.
        await cluster.delete_agent("researcher", namespace="team-b")

        async def gone() -> bool:
            return await cluster.get_agent("researcher", namespace="team-b") is None

        await eventually(gone, 60, "team-b's Agent deleted")
    latest = await store.agent("researcher")
    assert latest is not None and latest.version == 1 and latest.system == "You research."


@pytest.mark.usefixtures("operator")
async def test_two_tenants_each_have_an_agent_of_one_name(cluster: Cluster, store: RunStore) -> None:
    await cluster.create_agent("researcher", **RESEARCHER)
    await cluster.create_agent("researcher", namespace="team-b", system="Another team's agent.")
    await cluster.wait_agent("researcher", "version 1", _has_version(1))
    await cluster.wait_agent("researcher", "version 1", _has_version(1), namespace="team-b")
    ours, theirs = await store.agent("researcher"), await store.agent("researcher", tenant="team-b")
    assert ours is not None and ours.system == "You research." and ours.tenant == "default"
    assert theirs is not None and theirs.system == "Another team's agent." and theirs.tenant == "team-b"


@pytest.mark.usefixtures("operator")
async def test_an_agentrun_applied_with_its_agent_waits_for_it(cluster: Cluster, store: RunStore) -> None:
    # As `kubectl apply -f dir/` does it: both at once, the AgentRun even first; their watches are two.
    obj = await cluster.create("early", agentRef={"name": "late-agent"}, input="x")
    await cluster.create_agent("late-agent", **RESEARCHER)
    await cluster.wait_status("early", "Queued", lambda s: s.get("phase") == "Queued")
    run = await run_row(store, obj)
    assert (run.agent, run.agent_version, run.system) == ("late-agent", 1, "You research.")


@pytest.mark.usefixtures("operator")
async def test_an_agent_made_through_the_api_is_deleted_only_by_an_agent_that_stored_it(
    cluster: Cluster, store: RunStore
) -> None:
    await store.put_agent(Agent("kept", 0, system="made through the API"), created_by="alice")
    await store.put_agent(Agent("taken", 0, system="made through the API"), created_by="alice")
    await cluster.create_agent("kept", tools=["teleport"])  # refused: never stored over the API's
    await cluster.wait_agent("kept", "refused", lambda s: bool(s.get("message")))
    await cluster.create_agent("taken", system="the Agent's now")
    await cluster.wait_agent("taken", "version 2", _has_version(2))
    await cluster.delete_agent("kept")
    await cluster.delete_agent("taken")

    async def both_gone() -> bool:
        return await cluster.get_agent("kept") is None and await cluster.get_agent("taken") is None

    await eventually(both_gone, 60, "both Agents deleted")
    kept = await store.agent("kept")
    assert kept is not None and (kept.version, kept.created_by) == (1, "alice")
    assert await store.agent("taken") is None
