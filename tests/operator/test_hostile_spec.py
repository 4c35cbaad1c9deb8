"""Hostile AgentRun specs: the CRD schema refuses what it can express (sizes, types, tool names); what it
cannot (NUL, lone surrogates, a budget too small to store) ends with phase Failed and a message, once,
without a run, and the operator goes on serving others: never a crash loop or an endless retry."""

from __future__ import annotations

import copy
import uuid
from decimal import Decimal
from typing import Any

import pytest

from agentrun.operator import mapping
from agentrun.worker.core.records import RunStatus
from agentrun.worker.store import RunStore
from tests.support.cluster import Cluster, agentrun_manifest, assert_invalid, post_manifest, uid_of
from tests.support.waiting import eventually


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = {"a": [value]}
    return value


CRD_REFUSES: list[dict[str, Any]] = [
    {"input": "x" * 100_001},
    {"input": "🤖" * 100_001},  # the bound is in characters, and emoji are one each
    {"system": "s" * 100_001},
    {"model": "m" * 129},
    {"input": _nested(200)},
    {"input": ["a", "b"]},
    {"tools": [_nested(50)]},
    {"tools": ["lookup"] * 129},
    {"tools": ["look\u0000up"]},
    {"tools": ["\u202elookup"]},
    {"tools": ["lookup\u0301"]},
    {"tools": ["t" * 65]},
    {"tokenBudget": 10**30},
    {"timeoutSeconds": 2**31},
    {"costBudgetUsd": 1e300},
]


@pytest.mark.parametrize("change", CRD_REFUSES, ids=lambda c: repr(c)[:60])
async def test_the_crd_schema_refuses_oversized_and_malformed_specs(cluster: Cluster, change: dict[str, Any]) -> None:
    doc = copy.deepcopy(agentrun_manifest())
    doc["spec"].update(change)
    (field,) = change
    assert_invalid(await post_manifest(cluster, doc), f"spec.{field}")


# What passes the schema but PostgreSQL cannot store: the mapping refuses it, naming the field.
SCHEMA_PASSES: list[tuple[dict[str, Any], str]] = [
    ({"input": "before\u0000after"}, "spec.input contains a NUL character"),
    ({"input": "x\ud800y"}, "spec.input contains a lone surrogate"),
    ({"system": "\u0000"}, "spec.system contains a NUL character"),
    ({"model": "claude\u0000"}, "spec.model contains a NUL character"),
    ({"costBudgetUsd": 1e-9}, "spec.costBudgetUsd must be from 0.000001"),
    ({"costBudgetUsd": 4.9e-7}, "spec.costBudgetUsd must be from 0.000001"),
]


@pytest.mark.parametrize(("change", "message"), SCHEMA_PASSES, ids=lambda c: repr(c)[:40])
async def test_what_the_schema_lets_through_the_mapping_refuses(
    cluster: Cluster, change: dict[str, Any], message: str
) -> None:
    doc = copy.deepcopy(agentrun_manifest())
    doc["spec"].update(change)
    r = await post_manifest(cluster, doc)
    assert r.status_code == 201, r.text  # really past the schema, as an API server applies it
    with pytest.raises(mapping.InvalidSpec, match=message.replace(".", r"\.")):
        mapping.new_run(r.json()["spec"], str(uuid.uuid4()), "ns", "x")


@pytest.mark.parametrize(("field", "value"), [("tokenBudget", 2**63), ("timeoutSeconds", 2**31), ("maxSteps", 2**40),
                                              ("costBudgetUsd", 1e8), ("costBudgetUsd", 1e300)])
def test_without_a_schema_the_mapping_still_bounds_numbers_by_their_columns(field: str, value: Any) -> None:
    # An API server without the CRD's schema (or an older CRD) must not make the INSERT overflow for ever.
    with pytest.raises(mapping.InvalidSpec, match=f"spec.{field}"):
        mapping.new_run({"input": "x", field: value}, str(uuid.uuid4()), "ns", "x")


def test_a_cost_budget_is_kept_to_the_micro_dollar() -> None:
    new = mapping.new_run({"input": "x", "costBudgetUsd": 0.0000015}, str(uuid.uuid4()), "ns", "x")
    assert new.cost_budget_usd == Decimal("0.000002")


@pytest.mark.usefixtures("operator")
async def test_unstorable_specs_end_failed_once_and_the_operator_carries_on(cluster: Cluster, store: RunStore) -> None:
    bad = {"nul-input": {"input": "a\u0000b"}, "nul-system": {"input": "go", "system": "\u0000"},
           "tiny-budget": {"input": "go", "costBudgetUsd": 1e-9}}
    objs = {name: await cluster.create(name, **spec) for name, spec in bad.items()}
    for name in bad:
        status = await cluster.wait_status(name, "Failed", lambda s: s.get("phase") == "Failed")
        assert status["message"].startswith("spec.") and "Traceback" not in status["message"]
        assert {c["type"]: c["reason"] for c in status["conditions"]} == {"Ready": "InvalidSpec",
                                                                         "Succeeded": "InvalidSpec"}
        assert await store.get(uid_of(objs[name])) is None
    # The operator is not stuck retrying them: a good AgentRun made afterwards gets its run...
    good = await cluster.create("good", input="hello")

    async def queued() -> bool:
        run = await store.get(uid_of(good))
        return run is not None and run.status is RunStatus.QUEUED

    await eventually(queued, 60, "the good AgentRun's run")
    await cluster.wait_status("good", "Queued", lambda s: s.get("phase") == "Queued")
    # ...and each bad one was handled once: one InvalidSpec event, no retries behind it.
    for name in bad:
        assert [e["reason"] for e in cluster.events(name)].count("InvalidSpec") == 1, cluster.events(name)
