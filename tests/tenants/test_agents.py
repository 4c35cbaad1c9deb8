"""Agents are their tenant's: each tenant has its own names, another tenant's agent is not there (404), a run
(and a sub-agent call) finds its agent among its own tenant's only."""

from __future__ import annotations

import uuid

import httpx

from agentrun.worker.store import RunStore
from tests.support.tenants import auth

RUN = {"input": "x", "tokenBudget": 1000, "timeoutSeconds": 60}


async def test_each_tenant_has_its_own_agent_names(http: httpx.AsyncClient, store: RunStore) -> None:
    made = await http.post("/api/agents", json={"name": "helper", "system": "A's"}, headers=auth("alice"))
    assert made.status_code == 201 and made.json()["version"] == 1
    for path in ("/api/agents/helper", "/api/agents/helper/versions", "/api/agents/helper/versions/1"):
        assert (await http.get(path, headers=auth("bob"))).status_code == 404, path
    assert (await http.delete("/api/agents/helper", headers=auth("bob"))).status_code == 404
    assert (await http.get("/api/agents", headers=auth("bob"))).json()["items"] == []
    theirs = await http.post("/api/agents", json={"name": "helper", "system": "B's"}, headers=auth("bob"))
    assert theirs.status_code == 201 and theirs.json()["version"] == 1
    ours = (await http.get("/api/agents/helper", headers=auth("carol"))).json()
    assert (ours["system"], ours["tenant"]) == ("A's", "team-a")
    assert (await http.get("/api/agents?tenant=team-b", headers=auth("root"))).json()["items"][0]["system"] == "B's"
    refused = await http.get("/api/agents?tenant=team-b", headers=auth("alice"))
    assert refused.status_code == 403 and refused.json()["fields"][0]["field"] == "tenant"


async def test_a_run_gets_its_own_tenants_agent_and_sub_agents(http: httpx.AsyncClient, store: RunStore) -> None:
    await http.post("/api/agents", json={"name": "helper", "system": "A's"}, headers=auth("alice"))
    await http.post("/api/agents", json={"name": "lead", "system": "A's lead"}, headers=auth("alice"))
    await http.post("/api/agents", json={"name": "helper", "system": "B's"}, headers=auth("bob"))
    a = await http.post("/api/runs", json={**RUN, "agent": "helper", "subAgents": ["lead"]}, headers=auth("alice"))
    b = await http.post("/api/runs", json={**RUN, "agent": "helper"}, headers=auth("bob"))
    assert a.status_code == b.status_code == 201, (a.text, b.text)
    run_a, run_b = await store.get(uuid.UUID(a.json()["id"])), await store.get(uuid.UUID(b.json()["id"]))
    assert run_a is not None and (run_a.system, run_a.sub_agents) == ("A's", ("lead@1",))
    assert run_b is not None and run_b.system == "B's"
    missing = await http.post("/api/runs", json={**RUN, "subAgents": ["lead"]}, headers=auth("bob"))
    assert missing.status_code == 404 and missing.json()["fields"][0]["field"] == "subAgents[0]"
    unknown = await http.post("/api/agents", json={"name": "boss", "subAgents": ["lead"]}, headers=auth("bob"))
    assert unknown.status_code == 404


async def test_a_platform_operator_makes_an_agent_or_schedule_for_a_tenant_named_in_the_body(
    http: httpx.AsyncClient, store: RunStore,
) -> None:
    made = await http.post("/api/agents", json={"name": "helper", "tenant": "team-b"}, headers=auth("root"))
    assert made.status_code == 201 and await store.agent("helper", tenant="team-b") is not None
    refused = await http.post("/api/agents", json={"name": "helper", "tenant": "team-b"}, headers=auth("alice"))
    assert refused.status_code == 403 and refused.json()["fields"][0]["field"] == "tenant"
    schedule = {"name": "nightly", "intervalSeconds": 60, "run": RUN, "tenant": "team-b"}
    assert (await http.post("/api/schedules", json=schedule, headers=auth("root"))).status_code == 201
    assert (await store.schedule("nightly", "team-b")) is not None
    assert (await http.post("/api/schedules", json=schedule, headers=auth("alice"))).status_code == 403
