"""Who made and who cancelled an AgentRun's run: `k8s:<namespace>/<field manager>` from managedFields
where the API server tells it, else `k8s`."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.operator import mapping
from agentrun.worker.core.records import RunStatus
from agentrun.worker.store import RunStore
from tests.support.cluster import NAMESPACE, PATH, Cluster, uid_of
from tests.support.waiting import eventually


def _entry(manager: str, fields: dict[str, Any], time: str, subresource: str | None = None) -> dict[str, Any]:
    entry = {"manager": manager, "operation": "Update", "apiVersion": "agentrun.dev/v1alpha1", "time": time,
             "fieldsType": "FieldsV1", "fieldsV1": fields}
    return entry | ({"subresource": subresource} if subresource else {})


SPEC = {"f:spec": {".": {}, "f:input": {}}}
CANCEL = {"f:spec": {"f:cancel": {}}}


def _body(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"namespace": "team-a", "name": "x", "managedFields": list(entries)}}


def test_the_manager_that_wrote_the_spec_is_recorded() -> None:
    body = _body(
        _entry("kopf", {"f:metadata": {"f:finalizers": {}}}, "2026-01-01T00:00:02Z"),
        _entry("agentrun", {"f:status": {}}, "2026-01-01T00:00:03Z", subresource="status"),
        _entry("ci-bot", SPEC, "2026-01-01T00:00:01Z"),
    )
    assert mapping.requester(body) == "k8s:team-a/ci-bot"


def test_the_latest_writer_of_spec_cancel_is_who_cancelled() -> None:
    body = _body(_entry("ci-bot", SPEC | CANCEL, "2026-01-01T00:00:01Z"),
                 _entry("kubectl-patch", CANCEL, "2026-01-01T00:05:00Z"))
    assert mapping.requester(body, ("spec", "cancel"), latest=True) == "k8s:team-a/kubectl-patch"
    assert mapping.requester(body) == "k8s:team-a/ci-bot"


@pytest.mark.parametrize("body", [
    {}, {"metadata": {}}, {"metadata": {"managedFields": None}}, {"metadata": {"managedFields": "junk"}},
    _body(_entry("kopf", {"f:metadata": {}}, "t")),  # nobody wrote the spec
    _body(_entry("", SPEC, "t")), _body(_entry("evil\x00name", SPEC, "t")), _body(_entry("x" * 500, SPEC, "t")),
    _body({"manager": 7, "fieldsV1": SPEC}), _body({"manager": "m", "fieldsV1": ["f:spec"]}),
])
def test_without_a_usable_manager_the_run_says_k8s(body: dict[str, Any]) -> None:
    assert mapping.requester(body) == "k8s"


@pytest.mark.usefixtures("operator")
async def test_the_operator_records_the_creator_and_the_canceller(cluster: Cluster, store: RunStore) -> None:
    # The emulated API server keeps the managedFields it is given, as the real one would write them.
    body = {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun",
            "metadata": {"name": "audited", "namespace": NAMESPACE,
                         "managedFields": [_entry("ci-bot", SPEC, "2026-01-01T00:00:01Z")]},
            "spec": {"input": "go"}}
    r = await cluster.http.post(PATH, json=body)
    assert r.status_code == 201, r.text
    uid = uid_of(r.json())

    async def made() -> bool:
        return await store.get(uid) is not None

    await eventually(made, 60, "the run row")
    run = await store.get(uid)
    assert run is not None and run.created_by == f"k8s:{NAMESPACE}/ci-bot"

    fields = [_entry("ci-bot", SPEC, "2026-01-01T00:00:01Z"), _entry("oncall", CANCEL, "2026-01-01T00:09:00Z")]
    r = await cluster.http.patch(f"{PATH}/audited", json={"metadata": {"managedFields": fields}, "spec": {"cancel": True}},
                                 headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 200, r.text

    async def cancelled() -> bool:
        after = await store.get(uid)
        return after is not None and after.status is RunStatus.CANCELLED

    await eventually(cancelled, 60, "the run to be cancelled")
    after = await store.get(uid)
    assert after is not None and after.cancelled_by == f"k8s:{NAMESPACE}/oncall"

    # Told nothing, the operator says only that it came from Kubernetes.
    plain = await cluster.create("plain", input="go")

    async def plain_made() -> bool:
        return await store.get(uid_of(plain)) is not None

    await eventually(plain_made, 60, "the second run row")
    second = await store.get(uid_of(plain))
    assert second is not None and second.created_by == "k8s"
    await cluster.delete("plain")

    async def plain_cancelled() -> bool:
        found = await store.get(uid_of(plain))
        return found is not None and found.cancel_requested

    await eventually(plain_cancelled, 60, "the deleted AgentRun's run to be cancelled")
    gone = await store.get(uid_of(plain))
    assert gone is not None and gone.cancelled_by == "k8s"
