"""An AgentRun's run belongs to its namespace's tenant: the namespace's own name, or what the chart's
`tenants.namespaces` (AGENTRUN_NAMESPACE_TENANTS) maps it to; a continuation keeps its source's."""

from __future__ import annotations

import dataclasses

import pytest

from agentrun.operator import mapping
from agentrun.operator.settings import namespace_tenants
from agentrun.worker.core.tenants import Quotas
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from tests.support.builders import new_run, worker
from tests.support.cluster import Cluster, operator_running, run_row, settings_for


async def test_an_agentrun_is_its_namespaces_tenant(cluster: Cluster, database_url: str, store: RunStore) -> None:
    async with operator_running(cluster, settings_for(database_url)):
        run = await run_row(store, await cluster.create("plain", input="hi"))
    assert run.tenant == "default"  # the tests' namespace is named `default`


async def test_a_mapped_namespace_is_the_tenant_it_maps_to(
    cluster: Cluster, database_url: str, store: RunStore,
) -> None:
    async with operator_running(cluster, settings_for(database_url, namespace_tenants={"default": "acme"})):
        first = await run_row(store, await cluster.create("first", input="Say hello"))
        assert first.tenant == "acme"
        assert await worker(store, ScriptedLlm().then_text("hello", in_=10, out=5)).run_once() == first.id
        await cluster.wait_status("first", "Succeeded", lambda s: s.get("phase") == "Succeeded")
        after = await run_row(store, await cluster.create("next", input="and then?", continueFrom="first"))
    assert after.tenant == "acme" and after.parent_run_id == first.id


def test_the_namespace_map_is_checked() -> None:
    assert namespace_tenants(None) == {} and namespace_tenants(" ") == {}
    assert namespace_tenants('{"team-a": "acme"}') == {"team-a": "acme"}
    for bad, why in (("[1]", "JSON object"), ("{", "not JSON"), ('{"a": "Not_A_Tenant"}', "not a tenant name")):
        with pytest.raises(ValueError, match=why):
            namespace_tenants(bad)


async def test_an_agentrun_over_its_tenants_quota_waits_pending_and_is_made_once_there_is_room(
    cluster: Cluster, database_url: str, store: RunStore,
) -> None:
    await store.set_quotas("acme", Quotas(max_queued=0))
    async with operator_running(cluster, settings_for(database_url, namespace_tenants={"default": "acme"})):
        await cluster.create("held", input="hi")
        status = await cluster.wait_status("held", "Pending", lambda s: s.get("phase") == "Pending")
        assert "maxQueued" in status["message"] and "acme" in status["message"]
        assert status["conditions"][0]["reason"] == "OverQuota"
        assert await store.list_runs() == []
        await store.set_quotas("acme", Quotas(max_queued=5))
        await cluster.wait_status("held", "Queued", lambda s: s.get("phase") == "Queued")
    [run] = await store.list_runs()
    assert run.tenant == "acme"


async def test_a_run_held_back_by_its_tenants_budget_says_so_in_its_status(store: RunStore) -> None:
    run, _ = await store.create(new_run(tenant="acme"))
    held = dataclasses.replace(run, throttled={"quota": "tokensPerDay", "until": "2026-12-06T10:00:00+00:00",
                                               "reason": "acme used 5000 of its 5000 tokens per day"})
    assert mapping.phase_message(held) == ("held back by tenant acme's quota tokensPerDay until "
                                           "2026-12-06T10:00:00+00:00: acme used 5000 of its 5000 tokens per day")
    assert mapping.phase_message(run) == "waiting for a worker"
