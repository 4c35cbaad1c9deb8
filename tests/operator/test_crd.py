"""The CRD's schema as an API server enforces it (the emulator applies it, CEL included): the examples
pass, bad specs are refused with 422 Invalid naming the field, and only `cancel` may change."""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import httpx
import pytest
import yaml

from tests.support.cluster import PATH, Cluster, agentrun_manifest, agents_path, assert_invalid, post_manifest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "agentrun.yaml"
EXAMPLES = sorted((ROOT / "crds" / "examples").glob("*.yaml"))


def _crd() -> dict[str, Any]:
    return yaml.safe_load(CRD.read_text())  # type: ignore[no-any-return]


def _version() -> dict[str, Any]:
    (version,) = _crd()["spec"]["versions"]
    return version  # type: ignore[no-any-return]


async def _patch(cluster: Cluster, name: str, patch: dict[str, Any], subresource: str = "") -> httpx.Response:
    return await cluster.http.patch(f"{PATH}/{name}{subresource}", json=patch,
                                    headers={"Content-Type": "application/merge-patch+json"})


def test_crd_names_and_shape() -> None:
    crd = _crd()
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    spec = crd["spec"]
    assert (spec["group"], spec["scope"]) == ("agentrun.dev", "Namespaced")
    assert spec["names"]["kind"] == "AgentRun" and spec["names"]["plural"] == "agentruns"
    assert "ar" in spec["names"]["shortNames"]
    version = _version()
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c.get("priority", 0) for c in version["additionalPrinterColumns"]}
    assert columns == {"Phase": 0, "Tokens": 0, "Cost": 0, "Steps": 0, "Age": 0, "Worker": 1, "Message": 1}
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["phase"]["enum"] == ["Pending", "Queued", "Running", "Waiting", "Succeeded", "Failed", "Cancelled",
                                       "TimedOut"]
    assert {"runId", "tokensUsed", "costUsd", "steps", "startedAt", "finishedAt", "message", "lockedBy",
            "observedGeneration", "conditions"} <= set(status)


def test_the_crd_leaves_the_runtimes_defaults_to_the_operator() -> None:
    # A schema default would be in every spec, and override the agent an AgentRun names (spec.agentRef):
    # the operator applies the same defaults, and only to what neither the spec nor the agent gives.
    props = _version()["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    for field in ("model", "maxSteps", "tokenBudget", "timeoutSeconds"):
        assert "default" not in props[field], field
        assert f"{field} is immutable" in str(props[field]["x-kubernetes-validations"])
    assert props["agentRef"]["required"] == ["name"]


async def test_the_api_server_stores_the_spec_as_given(cluster: Cluster) -> None:
    created = (await post_manifest(cluster, agentrun_manifest())).json()
    assert created["spec"] == {"input": "hello", "cancel": False}


async def test_unknown_fields_are_pruned(cluster: Cluster) -> None:
    doc = agentrun_manifest()
    doc["spec"]["inputt"] = "typo"
    created = (await post_manifest(cluster, doc)).json()
    assert "inputt" not in created["spec"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
async def test_examples_are_accepted(cluster: Cluster, path: pathlib.Path) -> None:
    doc = yaml.safe_load(path.read_text())
    assert doc["apiVersion"] == "agentrun.dev/v1alpha1" and doc["kind"] in ("AgentRun", "Agent")
    doc["metadata"].pop("namespace", None)
    if doc["kind"] == "Agent":
        r = await cluster.http.post(agents_path(), json=doc)
    else:
        r = await post_manifest(cluster, doc)
    assert r.status_code == 201, r.text


def test_there_are_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {"minimal.yaml", "tools-and-budgets.yaml", "agent-researcher.yaml",
                                          "agentref.yaml"}


@pytest.mark.parametrize(
    "change, words",
    [
        ({"input": None}, ["spec", "give input, or forkFrom"]),
        ({"input": ""}, ["spec.input", "at least 1 chars"]),
        ({"input": 42}, ["spec.input", "must be of type string"]),
        ({"input": "x" * 100_001}, ["spec.input", "Too long"]),
        ({"tokenBudget": -1}, ["spec.tokenBudget", "greater than or equal to 1"]),
        ({"tokenBudget": 0}, ["spec.tokenBudget"]),
        ({"tokenBudget": 100_000_001}, ["spec.tokenBudget", "less than or equal to 100000000"]),
        ({"tokenBudget": "many"}, ["spec.tokenBudget", "must be of type integer"]),
        ({"timeoutSeconds": 0}, ["spec.timeoutSeconds"]),
        ({"timeoutSeconds": 604_801}, ["spec.timeoutSeconds"]),
        ({"maxSteps": -5}, ["spec.maxSteps"]),
        ({"maxSteps": 1.5}, ["spec.maxSteps", "must be of type integer"]),
        ({"maxSteps": True}, ["spec.maxSteps", "must be of type integer"]),
        ({"costBudgetUsd": 0}, ["spec.costBudgetUsd", "greater than 0"]),
        ({"costBudgetUsd": -0.5}, ["spec.costBudgetUsd"]),
        ({"costBudgetUsd": 100_001}, ["spec.costBudgetUsd"]),
        ({"costBudgetUsd": "cheap"}, ["spec.costBudgetUsd", "must be of type number"]),
        ({"model": ""}, ["spec.model"]),
        ({"model": "m" * 129}, ["spec.model", "Too long"]),
        ({"tools": "lookup"}, ["spec.tools", "must be of type array"]),
        ({"tools": ["bad name!"]}, ["spec.tools[0]", "should match"]),
        ({"tools": [""]}, ["spec.tools[0]"]),
        ({"tools": ["a", "a"]}, ["spec.tools[1]", "Duplicate value"]),
        ({"tools": [f"t{i}" for i in range(129)]}, ["spec.tools", "Too many"]),
        ({"cancel": "yes"}, ["spec.cancel", "must be of type boolean"]),
        ({"system": 7}, ["spec.system"]),
        ({"ttlSecondsAfterFinished": -1}, ["spec.ttlSecondsAfterFinished"]),
        ({"agentRef": {}}, ["spec.agentRef.name", "Required value"]),
        ({"agentRef": {"name": "Not_A_Label"}}, ["spec.agentRef.name", "should match"]),
        ({"agentRef": {"name": "a" * 64}}, ["spec.agentRef.name"]),
        ({"agentRef": {"name": "researcher", "version": 0}}, ["spec.agentRef.version"]),
        ({"agentRef": "researcher"}, ["spec.agentRef", "must be of type object"]),
    ],
    ids=repr,
)
async def test_invalid_specs_are_rejected(cluster: Cluster, change: dict[str, Any], words: list[str]) -> None:
    doc = agentrun_manifest()
    for key, value in change.items():
        if value is None:
            doc["spec"].pop(key)
        else:
            doc["spec"][key] = value
    assert_invalid(await post_manifest(cluster, doc), 'AgentRun.agentrun.dev "x" is invalid', *words)
    assert await cluster.get("x") is None  # nothing stored


async def test_missing_spec_is_rejected(cluster: Cluster) -> None:
    doc = copy.deepcopy(agentrun_manifest())
    del doc["spec"]
    assert_invalid(await post_manifest(cluster, doc), "spec: Required value")


FULL = {"input": "hello", "model": "claude-haiku-4-5", "tokenBudget": 5000, "timeoutSeconds": 30,
        "maxSteps": 7, "costBudgetUsd": 0.25, "tools": ["lookup"], "system": "be brief",
        "ttlSecondsAfterFinished": 60, "agentRef": {"name": "researcher"}}


@pytest.mark.parametrize("field, value", [
    ("input", "something else"), ("model", "claude-opus-4-1"), ("tokenBudget", 6000), ("timeoutSeconds", 31),
    ("maxSteps", 8), ("costBudgetUsd", 0.5), ("tools", ["lookup", "search"]), ("system", "be long"),
    ("ttlSecondsAfterFinished", 61), ("agentRef", {"name": "writer"}), ("agentRef", {"name": "researcher", "version": 2}),
])
async def test_everything_but_cancel_is_immutable(cluster: Cluster, field: str, value: Any) -> None:
    doc = agentrun_manifest()
    doc["spec"] = dict(FULL)
    assert (await post_manifest(cluster, doc)).status_code == 201
    assert_invalid(await _patch(cluster, "x", {"spec": {field: value}}), f"spec.{field}", f"{field} is immutable")
    assert ((await cluster.get("x")) or {})["spec"][field] == FULL[field]  # unchanged
    r = await _patch(cluster, "x", {"spec": {"cancel": True}})
    assert r.status_code == 200 and r.json()["spec"]["cancel"] is True, r.text


@pytest.mark.parametrize("field, value", [("system", "new"), ("tools", ["lookup"]), ("costBudgetUsd", 1),
                                          ("ttlSecondsAfterFinished", 5), ("model", "claude-haiku-4-5"),
                                          ("tokenBudget", 10), ("maxSteps", 3), ("timeoutSeconds", 9),
                                          ("agentRef", {"name": "researcher"})])
async def test_optional_fields_cannot_be_added_or_removed(cluster: Cluster, field: str, value: Any) -> None:
    assert (await post_manifest(cluster, agentrun_manifest())).status_code == 201
    assert_invalid(await _patch(cluster, "x", {"spec": {field: value}}), "cannot be added or removed after creation")
    doc = agentrun_manifest()
    doc["metadata"]["name"] = "y"
    doc["spec"][field] = value
    assert (await post_manifest(cluster, doc)).status_code == 201
    assert_invalid(await _patch(cluster, "y", {"spec": {field: None}}), "cannot be added or removed after creation")


async def test_a_status_the_operator_writes_is_accepted_and_a_bad_one_is_not(cluster: Cluster) -> None:
    assert (await post_manifest(cluster, agentrun_manifest())).status_code == 201
    status = {
        "phase": "Succeeded", "runId": "6f1c0a52-0000-0000-0000-000000000000", "tokensUsed": 15,
        "costUsd": "0.000105", "steps": 1, "startedAt": "2025-01-01T00:00:00Z",
        "finishedAt": "2025-01-01T00:00:01Z", "message": "", "lockedBy": "worker-A", "observedGeneration": 1,
        "conditions": [{"type": "Succeeded", "status": "True", "reason": "Succeeded", "message": "done",
                        "lastTransitionTime": "2025-01-01T00:00:01Z"}],
    }
    r = await _patch(cluster, "x", {"status": status}, "/status")
    assert r.status_code == 200 and r.json()["status"]["phase"] == "Succeeded", r.text
    assert_invalid(await _patch(cluster, "x", {"status": {"phase": "Done"}}, "/status"), "status.phase",
             "Unsupported value")
    assert_invalid(await _patch(cluster, "x", {"status": {"finishedAt": "yesterday"}}, "/status"), "status.finishedAt")
    assert_invalid(await _patch(cluster, "x", {"status": {"conditions": [{"type": "Ready"}]}}, "/status"),
             "status.conditions[0].status", "Required value")
    assert (await cluster.status_of("x"))["phase"] == "Succeeded"
