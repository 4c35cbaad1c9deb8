"""/api/agents over a real database: versions, identical bodies, reads, deletion, and every kind of bad body
answered with a 4xx naming the field, never a 500."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from agentrun.worker.store import RunStore

FULL = {"name": "researcher", "description": "Finds things.", "system": "You research.", "model": "claude-haiku-4-5",
        "tools": ["lookup"], "requireApproval": ["lookup"], "outputSchema": {"type": "object"}, "maxSteps": 12,
        "tokenBudget": 20_000, "costBudgetUsd": 2.5, "timeoutSeconds": 600, "subAgents": []}


def problems(r: httpx.Response) -> dict[str, str]:
    body = r.json()
    assert isinstance(body["error"], str) and body["error"], body
    return {p["field"]: p["problem"] for p in body["fields"]}


async def test_create_versions_and_read_back(client: httpx.AsyncClient) -> None:
    r = await client.post("/api/agents", json=FULL)
    assert (r.status_code, r.json()) == (201, {"name": "researcher", "version": 1})
    assert r.headers["location"] == "/api/agents/researcher/versions/1"
    same = await client.post("/api/agents", json=FULL)
    assert (same.status_code, same.json()) == (200, {"name": "researcher", "version": 1})
    changed = await client.post("/api/agents", json={**FULL, "system": "You research harder."})
    assert (changed.status_code, changed.json()) == (201, {"name": "researcher", "version": 2})
    # Back to the first definition: a new version (3), not version 1 again, since it differs from the latest.
    back = await client.post("/api/agents", json=FULL)
    assert back.json()["version"] == 3

    latest = (await client.get("/api/agents/researcher")).json()
    assert {k: latest[k] for k in FULL} == FULL and latest["version"] == 3 and latest["createdAt"]
    v2 = (await client.get("/api/agents/researcher/versions/2")).json()
    assert (v2["version"], v2["system"]) == (2, "You research harder.")
    versions = (await client.get("/api/agents/researcher/versions")).json()["items"]
    assert [v["version"] for v in versions] == [1, 2, 3]
    bare = await client.post("/api/agents", json={"name": "bare"})
    assert bare.status_code == 201
    listed = (await client.get("/api/agents")).json()["items"]
    assert [(a["name"], a["version"]) for a in listed] == [("bare", 1), ("researcher", 3)]
    assert listed[0]["system"] is None and listed[0]["tools"] is None


async def test_missing_things_are_404(client: httpx.AsyncClient) -> None:
    await client.post("/api/agents", json={"name": "one"})
    for path in ("/api/agents/nobody", "/api/agents/nobody/versions", "/api/agents/one/versions/2",
                 "/api/agents/nobody/versions/1"):
        r = await client.get(path)
        assert r.status_code == 404, path
        assert r.json()["error"]
    assert (await client.delete("/api/agents/nobody")).status_code == 404


async def test_delete_refuses_new_runs_and_keeps_versions_readable(client: httpx.AsyncClient, store: RunStore) -> None:
    await client.post("/api/agents", json={"name": "gone", "tokenBudget": 100, "timeoutSeconds": 60})
    run = await client.post("/api/runs", json={"input": "x", "agent": "gone"})
    assert run.status_code == 201
    r = await client.delete("/api/agents/gone")
    assert (r.status_code, r.content) == (204, b"")
    assert (await client.delete("/api/agents/gone")).status_code == 404
    assert (await client.get("/api/agents/gone")).status_code == 404
    assert (await client.get("/api/agents")).json()["items"] == []
    assert (await client.get("/api/agents/gone/versions/1")).status_code == 200  # a run is pinned to it
    refused = await client.post("/api/runs", json={"input": "x", "agent": "gone"})
    assert refused.status_code == 404 and "agent" in problems(refused)
    # The run in flight is untouched; a new put undeletes the name (same definition: same version).
    stored = await store.get(run.json()["id"])
    assert stored is not None and stored.agent_version == 1
    again = await client.post("/api/agents", json={"name": "gone", "tokenBudget": 100, "timeoutSeconds": 60})
    assert (again.status_code, again.json()["version"]) == (200, 1)
    assert (await client.get("/api/agents/gone")).status_code == 200


async def test_sub_agents_must_exist_and_not_be_the_agent(client: httpx.AsyncClient) -> None:
    await client.post("/api/agents", json={"name": "helper"})
    ok = await client.post("/api/agents", json={"name": "lead", "subAgents": ["helper", "helper@1"]})
    assert ok.status_code == 201
    assert (await client.get("/api/agents/lead")).json()["subAgents"] == ["helper", "helper@1"]  # as defined
    r = await client.post("/api/agents", json={"name": "lead", "subAgents": ["helper", "ghost"]})
    assert r.status_code == 404 and "ghost" in problems(r)["subAgents[1]"]
    r = await client.post("/api/agents", json={"name": "lead", "subAgents": ["helper@2"]})
    assert r.status_code == 404 and "subAgents[0]" in problems(r)
    r = await client.post("/api/agents", json={"name": "lead", "subAgents": ["helper", "lead@1"]})
    assert r.status_code == 422 and "itself" in problems(r)["subAgents[1]"]


async def test_require_approval_may_name_a_sub_agents_tool(client: httpx.AsyncClient) -> None:
    """A sub-agent call can need a person's approval like any call: its tool, `agent__<name>`, may be named
    in requireApproval wherever the sub-agent is, and only there."""
    await client.post("/api/agents", json={"name": "helper"})
    ok = await client.post("/api/agents", json={"name": "lead", "subAgents": ["helper"],
                                                "requireApproval": ["agent__helper"]})
    assert ok.status_code == 201, ok.text
    r = await client.post("/api/agents", json={"name": "lone", "requireApproval": ["agent__helper"]})
    assert r.status_code == 422 and "unknown tool 'agent__helper'" in problems(r)["requireApproval[0]"]
    run = await client.post("/api/runs", json={"input": "q", "subAgents": ["helper"], "tokenBudget": 1000,
                                                "timeoutSeconds": 60, "requireApproval": ["agent__helper"]})
    assert run.status_code == 201, run.text
    assert (await client.get(f"/api/runs/{run.json()['id']}")).json()["requireApproval"] == ["agent__helper"]
    run = await client.post("/api/runs", json={"input": "q", "agent": "lead", "tokenBudget": 1000,
                                                "timeoutSeconds": 60})
    assert run.status_code == 201, run.text
    r = await client.post("/api/runs", json={"input": "q", "subAgents": ["helper"], "tokenBudget": 1000,
                                             "timeoutSeconds": 60, "requireApproval": ["agent__ghost"]})
    assert r.status_code == 422, r.text
    assert "agent__ghost" in problems(r)["requireApproval[0]"] and "agent__helper" in problems(r)["requireApproval[0]"]


BAD: list[tuple[Any, int, str]] = [
    ({"name": "Researcher"}, 422, "name"),
    ({"name": "a_b"}, 422, "name"),
    ({"name": "-a"}, 422, "name"),
    ({"name": "a" * 64}, 422, "name"),
    ({"name": ""}, 422, "name"),
    ({"name": 5}, 422, "name"),
    ({}, 422, "name"),
    ({"name": "x", "tools": ["nope"]}, 422, "tools[0]"),
    ({"name": "x", "requireApproval": ["lookup", "nope"]}, 422, "requireApproval[1]"),
    ({"name": "x", "outputSchema": {"type": 5}}, 422, "outputSchema"),
    ({"name": "x", "outputSchema": []}, 422, "outputSchema"),
    ({"name": "x", "tokenBudget": -1}, 422, "tokenBudget"),
    ({"name": "x", "tokenBudget": 0}, 422, "tokenBudget"),
    ({"name": "x", "maxSteps": 1.5}, 422, "maxSteps"),
    ({"name": "x", "timeoutSeconds": "60"}, 422, "timeoutSeconds"),
    ({"name": "x", "costBudgetUsd": -0.5}, 422, "costBudgetUsd"),
    ({"name": "x", "costBudgetUsd": 1, "model": "unpriced-model"}, 422, "costBudgetUsd"),
    ({"name": "x", "subAgents": ["Bad"]}, 422, "subAgents[0]"),
    ({"name": "x", "subAgents": ["a@0"]}, 422, "subAgents[0]"),
    ({"name": "x", "subAgents": "helper"}, 422, "subAgents"),
    ({"name": "x", "system": "nul \x00"}, 422, "system"),
    ({"name": "x", "description": "nul \x00"}, 422, "description"),
    ({"name": "x", "model": ""}, 422, "model"),
    ({"name": "x", "tools": ["lookup"] * 300}, 422, "tools"),
    ({"name": "x", "input": "runs have inputs, agents do not"}, 422, "input"),
    ({"name": "x", "tokenbudget": 5}, 422, "tokenbudget"),
    ([], 422, "body"),
    ("x", 422, "body"),
]


@pytest.mark.parametrize(("body", "status", "field"), BAD, ids=[repr(b)[:40] for b, _, _ in BAD])
async def test_bad_bodies_name_the_field(client: httpx.AsyncClient, body: Any, status: int, field: str) -> None:
    r = await client.post("/api/agents", json=body)
    assert r.status_code == status, r.text
    assert field in problems(r), r.text
    assert (await client.get("/api/agents")).json()["items"] == []


async def test_hostile_raw_bodies_and_paths(client: httpx.AsyncClient) -> None:
    for raw in (b"{not json", b"", b"\xff\xfe", b'{"name": "a\\ud800"}', b"[" * 10_000, b'{"name": NaN}'):
        r = await client.post("/api/agents", content=raw, headers={"content-type": "application/json"})
        assert r.status_code in (400, 422), (raw[:20], r.text)
        assert r.json()["error"]
    for path in ("/api/agents/Bad_Name", "/api/agents/..%2f..%2fmetrics", "/api/agents/a/versions/0",
                 "/api/agents/a/versions/x", "/api/agents/a/versions/99999999999999999999", "/api/agents/" + "a" * 64):
        r = await client.get(path)
        assert r.status_code in (404, 422), (path, r.text)
        assert r.json()["error"]


async def test_concurrent_identical_creates_make_one_version(client: httpx.AsyncClient) -> None:
    answers = await asyncio.gather(*(client.post("/api/agents", json=FULL) for _ in range(8)))
    assert sorted(r.status_code for r in answers) == [200] * 7 + [201]
    assert {r.json()["version"] for r in answers} == {1}


async def test_a_nul_anywhere_in_an_output_schema_is_422_for_agents_and_runs(client: httpx.AsyncClient) -> None:
    schema = {"type": "object", "properties": {"a\x00b": {"type": "string"}}}
    r = await client.post("/api/agents", json={"name": "x", "outputSchema": schema})
    assert r.status_code == 422 and "NUL" in problems(r)["outputSchema"]
    r = await client.post("/api/runs", json={"input": "x", "tokenBudget": 5, "timeoutSeconds": 5,
                                             "outputSchema": {"enum": ["\x00"]}})
    assert r.status_code == 422 and "NUL" in problems(r)["outputSchema"]
