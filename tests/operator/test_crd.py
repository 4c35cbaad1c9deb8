"""The CRD's schema: the examples pass it, bad specs do not, and only `cancel` may change."""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "agentrun.yaml"
EXAMPLES = sorted((ROOT / "crds" / "examples").glob("*.yaml"))


def _crd() -> dict[str, Any]:
    return yaml.safe_load(CRD.read_text())  # type: ignore[no-any-return]


def _version() -> dict[str, Any]:
    (version,) = _crd()["spec"]["versions"]
    return version  # type: ignore[no-any-return]


def json_schema(oas: Any) -> Any:
    """Kubernetes' OpenAPI v3.0 dialect as JSON Schema: boolean exclusiveMinimum, x-kubernetes-* dropped."""
    if isinstance(oas, list):
        return [json_schema(x) for x in oas]
    if not isinstance(oas, dict):
        return oas
    out = {k: json_schema(v) for k, v in oas.items() if not k.startswith("x-kubernetes-") and k != "default"}
    if out.pop("exclusiveMinimum", None) is True:
        out["exclusiveMinimum"] = out.pop("minimum")
    if out.pop("exclusiveMaximum", None) is True:
        out["exclusiveMaximum"] = out.pop("maximum")
    return out


def _validator() -> jsonschema.Validator:
    schema = json_schema(_version()["schema"]["openAPIV3Schema"])
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


def _valid() -> dict[str, Any]:
    return {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": "x"},
            "spec": {"input": "hello"}}


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
    assert status["phase"]["enum"] == ["Pending", "Queued", "Running", "Succeeded", "Failed", "Cancelled", "TimedOut"]
    assert {"runId", "tokensUsed", "costUsd", "steps", "startedAt", "finishedAt", "message", "lockedBy",
            "observedGeneration", "conditions"} <= set(status)


def test_everything_but_cancel_is_immutable() -> None:
    spec = _version()["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for name, field in spec["properties"].items():
        rules = [r["rule"] for r in field.get("x-kubernetes-validations", [])]
        if name == "cancel":
            assert rules == []
        else:
            assert "self == oldSelf" in rules, name
    # Optional fields cannot appear or vanish either (a transition rule alone would not see that).
    assert "has(self.system) == has(oldSelf.system)" in spec["x-kubernetes-validations"][0]["rule"]


def test_minimal_manifest_has_defaults_for_the_runtime() -> None:
    props = _version()["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert props["model"]["default"] == "claude-sonnet-4-6"
    assert props["maxSteps"]["default"] == 100
    assert props["tokenBudget"]["default"] > 0 and props["timeoutSeconds"]["default"] > 0


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid(path: pathlib.Path) -> None:
    doc = yaml.safe_load(path.read_text())
    assert doc["apiVersion"] == "agentrun.dev/v1alpha1" and doc["kind"] == "AgentRun"
    _validator().validate(doc)


def test_there_are_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {"minimal.yaml", "tools-and-budgets.yaml"}


@pytest.mark.parametrize(
    "change",
    [
        {"input": None},
        {"input": ""},
        {"input": 42},
        {"input": "x" * 100_001},
        {"tokenBudget": -1},
        {"tokenBudget": 0},
        {"tokenBudget": "many"},
        {"timeoutSeconds": 0},
        {"maxSteps": -5},
        {"maxSteps": 1.5},
        {"costBudgetUsd": 0},
        {"costBudgetUsd": -0.5},
        {"costBudgetUsd": "cheap"},
        {"tools": "lookup"},
        {"tools": ["bad name!"]},
        {"tools": [""]},
        {"cancel": "yes"},
        {"system": 7},
        {"ttlSecondsAfterFinished": -1},
    ],
    ids=repr,
)
def test_invalid_specs_are_rejected(change: dict[str, Any]) -> None:
    doc = _valid()
    for key, value in change.items():
        if value is None:
            doc["spec"].pop(key)
        else:
            doc["spec"][key] = value
    with pytest.raises(jsonschema.ValidationError):
        _validator().validate(doc)


def test_missing_spec_is_rejected() -> None:
    doc = copy.deepcopy(_valid())
    del doc["spec"]
    with pytest.raises(jsonschema.ValidationError):
        _validator().validate(doc)


def test_a_status_the_operator_writes_is_valid() -> None:
    doc = _valid()
    doc["status"] = {
        "phase": "Succeeded", "runId": "6f1c0a52-0000-0000-0000-000000000000", "tokensUsed": 15,
        "costUsd": "0.000105", "steps": 1, "startedAt": "2025-01-01T00:00:00Z",
        "finishedAt": "2025-01-01T00:00:01Z", "message": "", "lockedBy": "worker-A", "observedGeneration": 1,
        "conditions": [{"type": "Succeeded", "status": "True", "reason": "Succeeded", "message": "done",
                        "lastTransitionTime": "2025-01-01T00:00:01Z"}],
    }
    _validator().validate(doc)
    doc["status"]["phase"] = "Done"
    with pytest.raises(jsonschema.ValidationError):
        _validator().validate(doc)
