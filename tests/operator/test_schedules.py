"""AgentSchedule resources: the CRD's names, columns and schema, and the real operator mirroring them into the
schedule table (emulated API server): stored, shown with its ticks, suspended, deleted; a hostile spec ends as
a status message, never a crash loop."""

from __future__ import annotations

import datetime
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import yaml

from agentrun.operator.schedules import schedule_definition
from agentrun.worker.runtime.schedules import Ticker
from agentrun.worker.store import RunStore
from tests.support.cluster import Cluster, assert_invalid, operator_running, settings_for
from tests.support.waiting import eventually

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "agentschedule.yaml"
RUN = {"input": "daily report", "tokenBudget": 1000, "timeoutSeconds": 60, "tools": ["lookup"]}


def path(namespace: str = "default") -> str:
    return f"/apis/agentrun.dev/v1alpha1/namespaces/{namespace}/agentschedules"


def manifest(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentSchedule", "metadata": {"name": name},
            "spec": spec}


@pytest.fixture
async def operator(cluster: Cluster, database_url: str) -> AsyncIterator[None]:
    async with operator_running(cluster, settings_for(database_url, schedule_status_seconds=0.3)):
        yield


async def status_of(cluster: Cluster, name: str) -> dict[str, Any]:
    r = await cluster.http.get(f"{path()}/{name}")
    return (r.json().get("status") or {}) if r.status_code == 200 else {}


async def wait_status(cluster: Cluster, name: str, what: str, check: Any, timeout: float = 60) -> dict[str, Any]:
    last: dict[str, Any] = {}

    async def ok() -> bool:
        last.clear()
        last.update(await status_of(cluster, name))
        return bool(check(last))

    try:
        await eventually(ok, timeout, f"AgentSchedule {name}: {what}")
    except AssertionError as e:
        raise AssertionError(f"{e} (last status: {last})") from None
    return dict(last)


def test_crd_names_columns_and_status() -> None:
    crd = yaml.safe_load(CRD.read_text())
    assert crd["metadata"]["name"] == "agentschedules.agentrun.dev"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == ("AgentSchedule", "agentschedules", ["as"])
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert columns == ["Schedule", "Suspend", "Last", "Next"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {"lastScheduleTime", "nextScheduleTime", "active"} <= set(status)


@pytest.mark.parametrize("spec, words", [
    ({"run": RUN}, ["exactly one of cron and intervalSeconds"]),
    ({"cron": "* * * * *", "intervalSeconds": 5, "run": RUN}, ["exactly one of cron and intervalSeconds"]),
    ({"intervalSeconds": 0, "run": RUN}, ["spec.intervalSeconds"]),
    ({"intervalSeconds": 5, "run": RUN, "concurrencyPolicy": "Sometimes"}, ["spec.concurrencyPolicy"]),
    ({"intervalSeconds": 5, "run": RUN, "startingDeadlineSeconds": -1}, ["spec.startingDeadlineSeconds"]),
    ({"intervalSeconds": 5, "run": RUN, "timezone": "../../etc/passwd"}, ["spec.timezone"]),
    ({"intervalSeconds": 5}, ["spec.run"]),
])
async def test_the_schema_refuses_bad_schedules(cluster: Cluster, spec: dict[str, Any], words: list[str]) -> None:
    assert_invalid(await cluster.http.post(path(), json=manifest("bad", **spec)), *words)
    assert_invalid(await cluster.http.post(path(), json=manifest("Bad.Name", intervalSeconds=5, run=RUN)),
                   "metadata.name")


@pytest.mark.parametrize("spec, words", [
    ({"cron": "61 * * * *", "run": RUN}, "spec.cron"),
    ({"cron": "* * * * *", "timezone": "Mars/Olympus", "run": RUN}, "spec.timezone"),
    ({"intervalSeconds": 5, "run": {**RUN, "input": "a\x00b"}}, "spec.run.input"),
    ({"intervalSeconds": 5, "run": {**RUN, "outputSchema": {"a": [{"b": "\x00"}]}}}, "spec.run.outputSchema.a[0].b"),
    ({"intervalSeconds": 5, "run": {**RUN, "system": "x" * 300_000}}, "bytes of JSON"),
    ({"intervalSeconds": 5, "run": {**RUN, "forkFrom": {"name": "x", "seq": 1}}}, "spec.run.forkFrom"),
    ({"intervalSeconds": True, "run": RUN}, "spec.intervalSeconds"),
])
def test_specs_the_runtime_cannot_use(spec: dict[str, Any], words: str) -> None:
    from agentrun.operator.mapping import InvalidSpec

    with pytest.raises(InvalidSpec, match=None) as e:
        schedule_definition("s", "default", spec)
    assert words in str(e.value)


@pytest.mark.usefixtures("operator")
async def test_stored_shown_suspended_and_deleted(cluster: Cluster, store: RunStore) -> None:
    r = await cluster.http.post(path(), json=manifest("hourly", intervalSeconds=3600, run=RUN))
    assert r.status_code == 201, r.text
    status = await wait_status(cluster, "hourly", "stored", lambda s: s.get("nextScheduleTime"))
    assert status["schedule"] == "every 3600s" and status["active"] == 0 and status.get("lastScheduleTime") is None
    stored = await store.schedule("hourly")
    assert stored is not None and stored.k8s_namespace == "default" and stored.run == RUN

    # A tick, by a worker's ticker: the status shows it (the timer reads the schedule back).
    await store.update_schedule(stored)  # no change
    async with store.pool.connection() as conn:
        await conn.execute("UPDATE schedule SET next_due_at = date_trunc('second', now()) WHERE name = 'hourly'")
    ticks = await Ticker(store, "w", "claude-sonnet-4-5").once()
    assert [t.outcome for t in ticks] == ["created"]
    tick = ticks[0].scheduled_time
    assert tick is not None
    status = await wait_status(cluster, "hourly", "the tick shown",
                               lambda s: s.get("lastScheduleTime") and s.get("active") == 1)
    assert status["lastScheduleTime"] == tick.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    r = await cluster.http.patch(f"{path()}/hourly", json={"spec": {"suspend": True}},
                                 headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 200, r.text
    await wait_status(cluster, "hourly", "suspended", lambda s: s.get("observedGeneration") == 2
                      and s.get("nextScheduleTime") is None and s.get("message") == "suspended")
    assert (await store.schedule("hourly")).suspend  # type: ignore[union-attr]

    assert (await cluster.http.delete(f"{path()}/hourly")).status_code == 200

    async def gone() -> bool:
        return await store.schedule("hourly") is None

    await eventually(gone, 60, "the schedule deleted with its AgentSchedule")


@pytest.mark.usefixtures("operator")
async def test_hostile_specs_end_in_a_status_message_and_the_operator_goes_on(cluster: Cluster, store: RunStore) -> None:
    hostile = {
        "nul": {"intervalSeconds": 5, "run": {**RUN, "outputSchema": {"deep": [{"x": "a\x00b"}]}}},
        "huge": {"intervalSeconds": 5, "run": {**RUN, "system": "y" * 300_000}},
        "tools": {"intervalSeconds": 5, "run": {**RUN, "tools": ["nosuch"]}},
        "agent": {"intervalSeconds": 5, "run": {"input": "x", "agentRef": {"name": "nobody"}}},
        "cron": {"cron": "99 * * * *", "run": RUN},
    }
    for name, spec in hostile.items():
        r = await cluster.http.post(path(), json=manifest(name, **spec))
        assert r.status_code == 201, (name, r.text)
    for name, word in (("nul", "spec.run.outputSchema.deep[0].x"), ("huge", "bytes of JSON"), ("tools", "nosuch"),
                       ("agent", "nobody"), ("cron", "spec.cron")):
        status = await wait_status(cluster, name, "refused", lambda s: s.get("conditions"))
        assert word in status["message"] and status["conditions"][0]["status"] == "False", (name, status)
        assert await store.schedule(name) is None
    # A REST schedule's name is not the AgentSchedule's to take.
    await store.create_schedule(schedule_definition("rest-made", "", {"intervalSeconds": 60, "run": RUN}))
    async with store.pool.connection() as conn:
        await conn.execute("UPDATE schedule SET k8s_namespace = NULL WHERE name = 'rest-made'")
    await cluster.http.post(path(), json=manifest("rest-made", intervalSeconds=5, run=RUN))
    status = await wait_status(cluster, "rest-made", "refused", lambda s: s.get("conditions"))
    assert "REST API" in status["message"]
    # ...and the operator still works.
    await cluster.http.post(path(), json=manifest("fine", cron="0 9 * * 1-5", timezone="Europe/Berlin", run=RUN))
    status = await wait_status(cluster, "fine", "stored", lambda s: s.get("nextScheduleTime"))
    assert status["schedule"] == "0 9 * * 1-5 (Europe/Berlin)"
