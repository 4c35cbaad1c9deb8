"""The `agentrun.dev/traceparent` annotation of an AgentRun: the run joins the caller's trace; malformed is refused."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.operator import mapping
from agentrun.worker.store import RunStore
from tests.support.cluster import NAMESPACE, PATH, Cluster, uid_of
from tests.support.waiting import eventually

CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_the_annotation_maps_to_the_runs_traceparent() -> None:
    new = mapping.new_run({"input": "go"}, "6f1c0a52-0000-4000-8000-000000000001", "ns", "n",
                          annotations={"agentrun.dev/traceparent": CALLER, "other": "x"})
    assert new.traceparent == CALLER
    assert mapping.new_run({"input": "go"}, "6f1c0a52-0000-4000-8000-000000000001", "ns", "n").traceparent is None
    with pytest.raises(mapping.InvalidSpec, match="annotation agentrun.dev/traceparent must be a W3C traceparent"):
        mapping.new_run({"input": "go"}, "6f1c0a52-0000-4000-8000-000000000001", "ns", "n",
                        annotations={"agentrun.dev/traceparent": "nonsense"})


async def _create(cluster: Cluster, name: str, traceparent: str) -> dict[str, Any]:
    body = {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun",
            "metadata": {"name": name, "namespace": NAMESPACE, "annotations": {"agentrun.dev/traceparent": traceparent}},
            "spec": {"input": "go"}}
    r = await cluster.http.post(PATH, json=body)
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


@pytest.mark.usefixtures("operator")
async def test_an_annotated_agentrun_makes_a_run_in_the_callers_trace(cluster: Cluster, store: RunStore) -> None:
    obj = await _create(cluster, "traced", CALLER)
    run_id = uid_of(obj)

    async def made() -> bool:
        return await store.get(run_id) is not None

    await eventually(made, 30, "the run of the annotated AgentRun")
    run = await store.get(run_id)
    assert run is not None and run.traceparent == CALLER


@pytest.mark.usefixtures("operator")
async def test_a_malformed_annotation_is_refused_in_the_status(cluster: Cluster, store: RunStore) -> None:
    await _create(cluster, "badly-traced", "nonsense")

    async def rejected() -> bool:
        return "traceparent" in str((await cluster.status_of("badly-traced")).get("message", ""))

    await eventually(rejected, 30, "the rejection in the status")
