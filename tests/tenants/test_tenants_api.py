"""GET/PUT /api/tenants/{name} and GET /api/tenants: a tenant's quotas and usage, for an admin identity of
tenant `*` only; bad input a 422 naming the field."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentrun.worker.api.app import create_app
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.tools import ToolBox
from tests.support.builders import MODEL, new_run
from tests.support.serving import asgi_client

QUOTAS = {"maxRunning": 50, "maxQueued": 10000, "tokensPerDay": 5e7, "costPerDayUsd": 200, "weight": 1}


async def test_put_then_get_then_list(client: httpx.AsyncClient, store: RunStore) -> None:
    assert (await client.get("/api/tenants/team-a")).status_code == 404
    r = await client.put("/api/tenants/team-a", json=QUOTAS)
    assert r.status_code == 200, r.text
    view = r.json()
    assert {k: view[k] for k in QUOTAS} == {**QUOTAS, "tokensPerDay": 50_000_000}
    assert view["configuredAt"] is not None and view["throttled"] is None
    await store.create(new_run(tenant="team-a"))
    got = (await client.get("/api/tenants/team-a")).json()
    assert (got["queued"], got["running"], got["tokensToday"], got["costTodayUsd"]) == (1, 0, 0, 0)
    # PUT sets all of them: those left out are no limit.
    r = await client.put("/api/tenants/team-a", json={"maxQueued": 1})
    assert r.status_code == 200
    got = r.json()
    assert (got["maxRunning"], got["maxQueued"], got["tokensPerDay"], got["weight"]) == (None, 1, None, 1.0)
    assert got["throttled"]["quota"] == "maxQueued"
    listed = (await client.get("/api/tenants")).json()["items"]
    assert [t["name"] for t in listed] == ["default", "team-a"]


@pytest.mark.parametrize(("body", "field"), [
    ({"maxRunning": -1}, "maxRunning"),
    ({"maxQueued": -5}, "maxQueued"),
    ({"tokensPerDay": 1.5}, "tokensPerDay"),
    ({"costPerDayUsd": -0.01}, "costPerDayUsd"),
    ({"weight": 0}, "weight"),
    ({"weight": 1001}, "weight"),
    ({"weight": None}, "weight"),
    ({"maxQueued": "10"}, "maxQueued"),
    ({"maxQueue": 10}, "maxQueue"),
])
async def test_bad_bodies_are_422_naming_the_field(client: httpx.AsyncClient, body: dict[str, Any],
                                                   field: str) -> None:
    r = await client.put("/api/tenants/team-a", json=body)
    assert r.status_code == 422, r.text
    assert [p["field"] for p in r.json()["fields"]] == [field]
    assert (await client.get("/api/tenants/team-a")).status_code == 404


@pytest.mark.parametrize("name", ["Team", "a_b", "-a", "x" * 64])
async def test_a_bad_tenant_name_is_422(client: httpx.AsyncClient, name: str) -> None:
    r = await client.put(f"/api/tenants/{name}", json={})
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "name", r.text


TOKENS = {"platform": ("admin", "*"), "platform-reader": ("read", "*"), "team-admin": ("admin", "team-a"),
          "team-submitter": ("submit", "team-a")}


@pytest.fixture
async def secured(store: RunStore, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"identities": [
        {"name": n, "sha256": hashlib.sha256(f"tok-{n}".encode()).hexdigest(), "scopes": [s], "tenant": t}
        for n, (s, t) in TOKENS.items()]}))
    settings = WorkerSettings(database_url="unused", default_model=MODEL, api_tokens_file=str(path))
    async with asgi_client(create_app(store, ToolBox(), settings, Metrics())) as c:
        yield c


@pytest.mark.parametrize("caller", list(TOKENS))
@pytest.mark.parametrize(("method", "path"), [("GET", "/api/tenants"), ("GET", "/api/tenants/default"),
                                              ("PUT", "/api/tenants/team-a")])
async def test_only_an_admin_of_every_tenant_reads_or_sets_quotas(
    secured: httpx.AsyncClient, caller: str, method: str, path: str,
) -> None:
    r = await secured.request(method, path, json={"maxQueued": 3} if method == "PUT" else None,
                              headers={"Authorization": f"Bearer tok-{caller}"})
    if caller == "platform":
        assert r.status_code == 200, r.text
    else:
        assert r.status_code == 403, r.text
        assert r.json()["error"]
    assert (await secured.request(method, path)).status_code == 401
