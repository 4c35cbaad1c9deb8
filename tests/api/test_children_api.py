"""Sub-agents over real HTTP and real PostgreSQL: a parent's children, its tree's totals, the wait for
its sub-agents in `pending`, decisions refused on such calls, and the runs list filtered by parent."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from agentrun.worker.store import RunStore
from tests.support.api import submit
from tests.support.serving import serving
from tests.support.trees import child_ids, finished_tree, tree_at_work


@pytest.fixture
async def http(app: FastAPI) -> Any:
    async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as c:
        yield c


async def test_a_finished_tree_lists_its_children_in_call_order_with_its_totals(
    store: RunStore, http: httpx.AsyncClient
) -> None:
    parent = await finished_tree(store, "researcher", "writer")
    r = await http.get(f"/api/runs/{parent.id}/children")
    assert r.status_code == 200, r.text
    children = r.json()
    assert [c["parentToolUseId"] for c in children] == ["toolu_0_agent__researcher", "toolu_1_agent__writer"]
    assert [c["id"] for c in children] == await child_ids(store, parent.id)
    for c in children:
        assert (c["parentRunId"], c["rootRunId"], c["depth"], c["status"]) == (
            str(parent.id), str(parent.id), 1, "SUCCEEDED")
        assert c["tokensUsedTotal"] == c["tokensUsed"] and c["childrenActive"] == 0 and c["waitingFor"] is None

    run = (await http.get(f"/api/runs/{parent.id}")).json()
    assert (run["parentRunId"], run["parentToolUseId"], run["rootRunId"], run["depth"]) == (
        None, None, str(parent.id), 0)
    assert run["tokensUsedTotal"] == run["tokensUsed"] + sum(c["tokensUsed"] for c in children)
    assert run["costUsdTotal"] == pytest.approx(run["costUsd"] + sum(c["costUsd"] for c in children))
    assert (run["childrenActive"], run["waitingFor"]) == (0, None)
    # A child has no children; the parent's pending list is empty once it has finished.
    assert (await http.get(f"/api/runs/{children[0]['id']}/children")).json() == []
    assert (await http.get(f"/api/runs/{parent.id}/pending")).json() == []


async def test_a_parent_waiting_for_its_sub_agents_says_so_and_takes_no_decision(
    store: RunStore, http: httpx.AsyncClient
) -> None:
    async with tree_at_work(store, "researcher", "writer") as (parent, hold):
        run = (await http.get(f"/api/runs/{parent.id}")).json()
        assert (run["status"], run["waitingFor"], run["childrenActive"], run["pending"]) == (
            "WAITING", "children", 2, 2)
        ids = await child_ids(store, parent.id)
        pending = (await http.get(f"/api/runs/{parent.id}/pending")).json()
        assert [(p["toolUseId"], p["tool"], p["kind"], p["childRunId"]) for p in pending] == [
            ("toolu_0_agent__researcher", "agent__researcher", "children", ids[0]),
            ("toolu_1_agent__writer", "agent__writer", "children", ids[1]),
        ]
        assert pending[0]["input"] == {"task": "part 1 of: the question"} and pending[0]["since"]
        # The totals count what the children at work have spent so far (their first turn may be under way).
        assert run["tokensUsedTotal"] >= run["tokensUsed"]

        r = await http.post(f"/api/runs/{parent.id}/pending/toolu_0_agent__researcher", json={"decision": "approve"})
        assert r.status_code == 409, r.text
        assert "sub-agent" in r.json()["error"] and ids[0] in r.json()["error"]
        r = await http.post(f"/api/runs/{parent.id}/pending/no-such-call", json={"decision": "approve"})
        assert r.status_code == 409 and "waits for its sub-agents, not for a decision" in r.json()["error"]
        # A bad body is still named as such; an unknown run is still a 404.
        r = await http.post(f"/api/runs/{parent.id}/pending/toolu_0_agent__researcher", json={"decision": "maybe"})
        assert r.status_code == 422 and r.json()["fields"][0]["field"] == "decision"
        r = await http.post(f"/api/runs/{uuid.uuid4()}/pending/x", json={"decision": "approve"})
        assert r.status_code == 404

        child = (await http.get(f"/api/runs/{ids[0]}")).json()
        assert (child["parentRunId"], child["parentToolUseId"], child["rootRunId"], child["depth"]) == (
            str(parent.id), "toolu_0_agent__researcher", str(parent.id), 1)
        assert (child["status"], child["waitingFor"]) == ("RUNNING", None)
        hold.set()


async def test_children_of_an_unknown_or_malformed_run(http: httpx.AsyncClient) -> None:
    r = await http.get(f"/api/runs/{uuid.uuid4()}/children")
    assert r.status_code == 404 and "no run with id" in r.json()["error"]
    r = await http.get("/api/runs/not-a-uuid/children")
    assert r.status_code == 422 and r.json()["fields"][0]["field"] == "id"
    # A run without sub-agents has no children, and waits (if ever) for decisions.
    run_id = await submit(http)
    assert (await http.get(f"/api/runs/{run_id}/children")).json() == []
    assert (await http.get(f"/api/runs/{run_id}")).json()["rootRunId"] == run_id


async def test_the_runs_list_filters_by_parent_and_pages_through_them(
    store: RunStore, http: httpx.AsyncClient
) -> None:
    parent = await finished_tree(store, "alpha", "beta", "gamma")
    other = await finished_tree(store, "delta")
    ids = await child_ids(store, parent.id)
    page = (await http.get("/api/runs", params={"parent": str(parent.id), "limit": 2})).json()
    assert [r["id"] for r in page["items"]] == ids[::-1][:2] and page["next"] == ids[1]
    rest = (await http.get("/api/runs", params={"parent": str(parent.id), "limit": 2, "after": page["next"]})).json()
    assert ([r["id"] for r in rest["items"]], rest["next"]) == ([ids[0]], None)
    assert ids[0] not in await child_ids(store, other.id)
    both = (await http.get("/api/runs", params={"parent": str(parent.id), "status": "FAILED"})).json()
    assert both == {"items": [], "next": None}
    assert (await http.get("/api/runs", params={"parent": str(uuid.uuid4())})).json() == {"items": [], "next": None}
    for bad in ("nope", "", "1" * 300, "'; DROP TABLE run; --"):
        r = await http.get("/api/runs", params={"parent": bad})
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["fields"][0]["field"] == "parent"
