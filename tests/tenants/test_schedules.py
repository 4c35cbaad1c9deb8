"""Schedules are their tenant's: each tenant has its own names, another tenant's schedule is not there (404),
a tick makes a run of the schedule's tenant (its agent found among that tenant's), and two tenants' schedules of
one name tick apart, each making its own run."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import psycopg

from agentrun.worker.runtime.schedules import Ticker
from agentrun.worker.store import RunStore
from tests.support.tenants import auth

RUN = {"input": "report", "tokenBudget": 1000, "timeoutSeconds": 60}
NIGHTLY = {"name": "nightly", "intervalSeconds": 3600, "run": RUN}


async def test_each_tenant_has_its_own_schedule_names(http: httpx.AsyncClient) -> None:
    assert (await http.post("/api/schedules", json=NIGHTLY, headers=auth("alice"))).status_code == 201
    for method, path in (("GET", "/api/schedules/nightly"), ("GET", "/api/schedules/nightly/runs"),
                         ("PATCH", "/api/schedules/nightly"), ("DELETE", "/api/schedules/nightly")):
        body = {"suspend": True} if method == "PATCH" else None
        r = await http.request(method, path, json=body, headers=auth("bob"))
        assert r.status_code == 404, (method, path, r.text)
    assert (await http.get("/api/schedules", headers=auth("bob"))).json()["items"] == []
    assert (await http.post("/api/schedules", json=NIGHTLY, headers=auth("bob"))).status_code == 201
    mine = (await http.get("/api/schedules/nightly", headers=auth("carol"))).json()
    assert mine["tenant"] == "team-a" and mine["suspend"] is False
    assert (await http.get("/api/schedules?tenant=team-b", headers=auth("root"))).json()["items"][0]["tenant"] == \
        "team-b"
    assert (await http.get("/api/schedules?tenant=team-b", headers=auth("alice"))).status_code == 403
    foreign = await http.post("/api/schedules", json={**NIGHTLY, "name": "x", "run": {**RUN, "tenant": "team-b"}},
                              headers=auth("root"))
    assert foreign.status_code == 422 and foreign.json()["fields"][0]["field"] == "run.tenant"


async def test_two_tenants_schedules_of_one_name_tick_apart_into_their_own_runs(
    http: httpx.AsyncClient, store: RunStore, db: psycopg.AsyncConnection[Any],
) -> None:
    await http.post("/api/agents", json={"name": "reporter", "system": "A's"}, headers=auth("alice"))
    await http.post("/api/agents", json={"name": "reporter", "system": "B's"}, headers=auth("bob"))
    for who in ("alice", "bob"):
        r = await http.post("/api/schedules", json={**NIGHTLY, "run": {**RUN, "agent": "reporter"}}, headers=auth(who))
        assert r.status_code == 201, r.text
    await db.execute("UPDATE schedule SET next_due_at = date_trunc('second', now())")
    ticks = await Ticker(store, "t1", "claude-sonnet-4-5").once()
    assert sorted(t.outcome for t in ticks) == ["created", "created"]
    made = {t.run_id for t in ticks}
    runs = {r.tenant: r for r in await store.list_runs() if r.id in made}
    assert set(runs) == {"team-a", "team-b"}
    assert (runs["team-a"].system, runs["team-b"].system) == ("A's", "B's")
    assert runs["team-a"].id != runs["team-b"].id
    for who, tenant in (("alice", "team-a"), ("bob", "team-b")):
        listed = (await http.get("/api/schedules/nightly/runs", headers=auth(who))).json()
        assert [uuid.UUID(r["id"]) for r in listed] == [runs[tenant].id]
