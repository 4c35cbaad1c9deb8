"""Tenants are isolated on every route of the OpenAPI document: an identity of one tenant finds another
tenant's run nowhere (a 404, as for a run that does not exist, never a 403), in lists, the event stream,
decisions, messages, cancels, continuations and forks; its Idempotency-Key makes a run of its own; and a
platform operator's identity (tenant `*`) sees every tenant's runs."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from agentrun.worker.core.recording import NewReplay
from agentrun.worker.core.records import DecisionKind
from agentrun.worker.core.submission import Caller
from agentrun.worker.runtime.door import Door
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolBox
from tests.support.builders import new_run, worker
from tests.support.tenants import auth


@pytest.fixture
async def team_a(store: RunStore) -> dict[str, str]:
    """Team A's runs: one finished with a model and a tool step, one waiting for a decision."""
    done, _ = await store.create(new_run("look it up", tenant="team-a"))
    llm = ScriptedLlm().then_tool_use("toolu_1", "noop", {}, 10, 5).then_text("done", 10, 5)
    await worker(store, llm, ToolBox([])).run_once()
    waiting, _ = await store.create(new_run("ask first", tenant="team-a"))
    claimed = await store.claim("w", 30)
    assert claimed is not None and claimed.run.id == waiting.id
    await store.park(waiting.id, "w", [("toolu_2", DecisionKind.APPROVAL, "noop", "{}", 0)])
    return {"done": str(done.id), "waiting": str(waiting.id)}


@pytest.fixture
async def team_a_all(store: RunStore, team_a: dict[str, str]) -> dict[str, str]:
    """Team A's runs and a replay of the finished one, for the tests that walk every operation."""
    done = await store.get(uuid.UUID(team_a["done"]))
    assert done is not None
    replay = NewReplay(id=uuid.uuid4(), request={"runs": [str(done.id)]})
    await Door(store).replay(replay, [done], Caller(tenant="team-a"))
    return {**team_a, "replay": str(replay.id)}


def _operations(document: dict[str, Any]) -> list[tuple[str, str]]:
    return [(method.upper(), path) for path, ops in document["paths"].items() for method in ops]


def _body(method: str, path: str) -> dict[str, Any] | None:
    if method not in ("POST", "PUT", "PATCH"):
        return None
    if path.endswith("/messages"):
        return {"text": "hello"}
    if path.endswith("/pending/{toolUseId}"):
        return {"decision": "approve"}
    return {}


def _url(path: str, run_id: str) -> str:
    return path.replace("{id}", run_id).replace("{seq}", "1").replace("{toolUseId}", "toolu_2")


def _run_operations(client: httpx.AsyncClient) -> list[tuple[str, str]]:
    app = client._transport.app  # type: ignore[attr-defined]
    operations = [op for op in _operations(app.openapi()) if "{id}" in op[1]]
    assert len(operations) >= 10  # every route of a run, not a chosen few
    return operations


def _run_for(method: str, path: str, runs: dict[str, str]) -> str:
    alive = "pending" in path or path.endswith(("/cancel", "/messages")) and method == "POST"
    if path.startswith("/api/replays/"):
        return runs["replay"]
    return runs["waiting"] if alive else runs["done"]


async def test_another_tenants_run_is_a_404_on_every_route_of_a_run(
    http: httpx.AsyncClient, team_a_all: dict[str, str],
) -> None:
    team_a = team_a_all
    for method, path in _run_operations(http):
        url = _url(path, _run_for(method, path, team_a))
        r = await http.request(method, url, json=_body(method, path), headers=auth("bob"))
        assert r.status_code == 404, (method, path, r.status_code, r.text)
        assert "team-a" not in r.text and "look it up" not in r.text


async def test_its_own_tenant_and_a_platform_operator_see_it_on_every_route(
    http: httpx.AsyncClient, team_a_all: dict[str, str],
) -> None:
    team_a = team_a_all
    for who in ("carol", "root"):  # reads only: the writes would change the run for the next caller
        for method, path in _run_operations(http):
            if method != "GET":
                continue
            r = await http.request(method, _url(path, _run_for(method, path, team_a)), headers=auth(who))
            assert 200 <= r.status_code < 300, (who, method, path, r.status_code, r.text)


async def test_its_tenants_writes_act_and_anothers_change_nothing(
    http: httpx.AsyncClient, store: RunStore, team_a: dict[str, str],
) -> None:
    waiting = team_a["waiting"]
    for who, status in (("bob", 404), ("alice", 200)):
        r = await http.post(f"/api/runs/{waiting}/pending/toolu_2", json={"decision": "approve"}, headers=auth(who))
        assert r.status_code == status, (who, r.text)
        if who == "bob":
            run = await store.get(uuid.UUID(waiting))
            assert run is not None and run.status.value == "WAITING" and run.pending == 1
    assert (await http.post(f"/api/runs/{team_a['done']}/messages", json={"text": "x"}, headers=auth("bob"))
            ).status_code == 404
    assert await store.messages(uuid.UUID(team_a["done"])) == []


async def test_lists_show_only_the_callers_tenant(http: httpx.AsyncClient, team_a: dict[str, str]) -> None:
    body = {"input": "b's own", "tokenBudget": 1000, "timeoutSeconds": 60}
    mine = (await http.post("/api/runs", json=body, headers=auth("bob"))).json()["id"]

    async def listed(who: str, query: str = "") -> set[str]:
        r = await http.get(f"/api/runs{query}", headers=auth(who))
        assert r.status_code == 200, r.text
        return {item["id"] for item in r.json()["items"]}

    assert await listed("bob") == {mine}
    assert await listed("alice") == set(team_a.values())
    assert await listed("root") == {mine, *team_a.values()}
    assert await listed("root", "?tenant=team-b") == {mine}
    assert await listed("bob", "?tenant=team-a") == set()
    assert await listed("bob", f"?parent={team_a['done']}") == set()
    view = (await http.get(f"/api/runs/{mine}", headers=auth("root"))).json()
    assert (view["tenant"], view["throttled"]) == ("team-b", None)


async def test_continuing_or_forking_another_tenants_run_is_a_404(
    http: httpx.AsyncClient, store: RunStore, team_a: dict[str, str],
) -> None:
    for body in ({"input": "go on", "continueFrom": team_a["done"]}, {"forkFrom": {"runId": team_a["done"], "seq": 1}}):
        r = await http.post("/api/runs", json={"tokenBudget": 1000, "timeoutSeconds": 60, **body}, headers=auth("bob"))
        assert r.status_code == 404, r.text
    assert len(await store.list_runs()) == 2
    r = await http.post("/api/runs", json={"input": "go on", "continueFrom": team_a["done"]}, headers=auth("alice"))
    assert r.status_code == 201, r.text
    made = await store.get(uuid.UUID(r.json()["id"]))
    assert made is not None and made.tenant == "team-a"


async def test_a_platform_operator_continues_in_the_sources_tenant(
    http: httpx.AsyncClient, store: RunStore, team_a: dict[str, str],
) -> None:
    r = await http.post("/api/runs", json={"input": "go on", "continueFrom": team_a["done"]}, headers=auth("root"))
    assert r.status_code == 201, r.text
    made = await store.get(uuid.UUID(r.json()["id"]))
    assert made is not None and made.tenant == "team-a"
    r = await http.post("/api/runs", json={"input": "go on", "continueFrom": team_a["done"], "tenant": "team-b"},
                        headers=auth("root"))
    assert r.status_code == 422 and "source's tenant" in r.text


async def test_an_idempotency_key_is_its_tenants(http: httpx.AsyncClient, store: RunStore) -> None:
    body = {"input": "pay the invoice", "tokenBudget": 1000, "timeoutSeconds": 60}
    first = await http.post("/api/runs", json=body, headers={**auth("alice"), "Idempotency-Key": "k-1"})
    again = await http.post("/api/runs", json=body, headers={**auth("alice"), "Idempotency-Key": "k-1"})
    other = await http.post("/api/runs", json=body, headers={**auth("bob"), "Idempotency-Key": "k-1"})
    assert first.status_code == again.status_code == other.status_code == 201
    assert again.json()["id"] == first.json()["id"] and again.headers.get("Idempotent-Replayed") == "true"
    assert other.json()["id"] != first.json()["id"] and "Idempotent-Replayed" not in other.headers
    # Another body under the same key is that tenant's own business: bob's key is not alice's.
    changed = await http.post("/api/runs", json={**body, "input": "something else"},
                              headers={**auth("bob"), "Idempotency-Key": "k-1"})
    assert changed.status_code == 422
    assert (await http.get(f"/api/runs/{first.json()['id']}", headers=auth("bob"))).status_code == 404
    runs = {r.id: r.tenant for r in await store.list_runs()}
    assert runs == {uuid.UUID(first.json()["id"]): "team-a", uuid.UUID(other.json()["id"]): "team-b"}


async def test_a_run_is_its_identitys_tenant_and_only_a_platform_operator_names_another(
    http: httpx.AsyncClient, store: RunStore,
) -> None:
    body = {"input": "x", "tokenBudget": 1000, "timeoutSeconds": 60}
    own = await http.post("/api/runs", json=body, headers=auth("alice"))
    named_own = await http.post("/api/runs", json={**body, "tenant": "team-a"}, headers=auth("alice"))
    foreign = await http.post("/api/runs", json={**body, "tenant": "team-b"}, headers=auth("alice"))
    rooted = await http.post("/api/runs", json=body, headers=auth("root"))
    placed = await http.post("/api/runs", json={**body, "tenant": "team-c"}, headers=auth("root"))
    bad = await http.post("/api/runs", json={**body, "tenant": "Team C"}, headers=auth("root"))
    assert (own.status_code, named_own.status_code, foreign.status_code) == (201, 201, 403)
    assert "team-a" in foreign.json()["error"] and foreign.json()["fields"][0]["field"] == "tenant"
    assert (rooted.status_code, placed.status_code, bad.status_code) == (201, 201, 422)
    tenants = {str(r.id): r.tenant for r in await store.list_runs()}
    assert tenants == {own.json()["id"]: "team-a", named_own.json()["id"]: "team-a",
                       rooted.json()["id"]: "default", placed.json()["id"]: "team-c"}


async def test_whoami_names_the_tenant(http: httpx.AsyncClient) -> None:
    assert (await http.get("/api/whoami", headers=auth("carol"))).json()["tenant"] == "team-a"
    assert (await http.get("/api/whoami", headers=auth("root"))).json()["tenant"] == "*"


async def test_every_operation_of_the_document_hides_another_tenants_things(
    http: httpx.AsyncClient, store: RunStore, team_a_all: dict[str, str],
) -> None:
    """Bob (team-b) calls every operation of the OpenAPI document at team-a's runs, agent and schedule: a 404
    for each of them by name or id, lists without them, a name of theirs free for his own, an event that wakes
    none of theirs; and no answer carries anything of team-a's."""
    team_a = team_a_all
    secret = "team a's secret system prompt"
    assert (await http.post("/api/agents", json={"name": "helper", "system": secret}, headers=auth("alice"))
            ).status_code == 201
    schedule = {"name": "nightly", "intervalSeconds": 3600, "run": {"input": secret, "tokenBudget": 10,
                                                                    "timeoutSeconds": 60}}
    assert (await http.post("/api/schedules", json=schedule, headers=auth("alice"))).status_code == 201
    app = http._transport.app  # type: ignore[attr-defined]
    operations = _operations(app.openapi())
    assert len(operations) >= 30  # the whole document, not a chosen few
    bodies = {
        ("POST", "/api/runs"): {"input": "x", "tokenBudget": 10, "timeoutSeconds": 60, "continueFrom": team_a["done"]},
        ("POST", "/api/agents"): {"name": "helper", "system": "b's own"},
        ("POST", "/api/schedules"): {**schedule, "run": {**schedule["run"], "input": "b's own"}},
        ("POST", "/api/events"): {"key": "deploy"},
        ("PATCH", "/api/schedules/{name}"): {"suspend": True},
        ("PUT", "/api/tenants/{name}"): {"maxRunning": 0},
        ("POST", "/api/replays"): {"runs": [team_a["done"]]},
    }
    creates = {("POST", "/api/agents"), ("POST", "/api/schedules")}  # last: they make bob's own of those names
    for method, path in sorted(operations, key=lambda op: op in creates):
        name = "helper" if "agents" in path else "team-a" if "tenants" in path else "nightly"
        url = _url(path, _run_for(method, path, team_a)).replace("{name}", name)
        url = url.replace("{n}", "1")
        body = bodies.get((method, path), _body(method, path))
        r = await http.request(method, url, json=body, headers=auth("bob"))
        text = r.text
        assert secret not in text and "team-a" not in text, (method, path, text)
        if r.status_code < 300:  # a 404 may echo the id asked for, nothing more
            assert not any(i in text for i in team_a.values()), (method, path, text)
        if path.startswith("/api/tenants"):
            assert r.status_code == 403, (method, path, r.status_code, text)  # for admins of every tenant only
        elif "{id}" in path or "{name}" in path:
            assert r.status_code == 404, (method, path, r.status_code, text)
        elif path in ("/api/runs", "/api/replays") and method == "POST":
            assert r.status_code == 404, text  # continueFrom (or replay) a run bob cannot see
        elif method == "POST":
            assert r.status_code in (200, 201), (method, path, r.status_code, text)  # his own, in his tenant
        else:
            assert r.status_code == 200, (method, path, r.status_code, text)
    # Bob's agent and schedule of those names are his, next to alice's untouched ones.
    theirs = await store.agent("helper", tenant="team-a")
    assert theirs is not None and theirs.system == secret
    found = await store.schedule("nightly", "team-a")
    assert found is not None and not found.suspend
