"""Runs made from agent definitions through POST /api/runs: the agent applied and pinned at submission,
overrides that may only lower, 404s naming the agent, continuations keeping the pin, and a pinned
version surviving an edit of the agent while the run works."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

import httpx
import psycopg
import pytest

from agentrun.worker.core.agents import Agent
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolBox, ToolContext, tool
from tests.support.api import lookup, make_app, status_is
from tests.support.builders import SimulatedCrash, worker
from tests.support.serving import asgi_client

RESEARCHER = Agent(name="researcher", version=0, description="finds things", system="You research.",
                   model="claude-haiku-4-5", tools=("lookup",), max_steps=12, token_budget=20_000,
                   cost_budget_usd=Decimal("2"), timeout_seconds=600)


def problems(r: httpx.Response) -> dict[str, str]:
    return {p["field"]: p["problem"] for p in r.json()["fields"]}


async def run_of(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    r = await client.post("/api/runs", json={"input": "find x", **body})
    assert r.status_code == 201, r.text
    return (await client.get(f"/api/runs/{r.json()['id']}")).json()  # type: ignore[no-any-return]


async def test_a_run_takes_the_agents_fields_and_is_pinned(client: httpx.AsyncClient, store: RunStore) -> None:
    await store.put_agent(RESEARCHER)
    await store.put_agent(Agent(name="helper", version=0, description="helps"))
    await store.put_agent(RESEARCHER.__class__(**{**RESEARCHER.__dict__, "system": "v2", "sub_agents": ("helper",)}))
    latest = await run_of(client, agent="researcher")
    assert (latest["agent"], latest["agentVersion"], latest["subAgents"]) == ("researcher", 2, ["helper@1"])
    assert (latest["system"], latest["model"], latest["tools"], latest["maxSteps"], latest["tokenBudget"],
            latest["costBudgetUsd"], latest["timeoutSeconds"]) == ("v2", "claude-haiku-4-5", ["lookup"], 12, 20_000,
                                                                     2.0, 600)
    first = await run_of(client, agent="researcher@1", system="mine", tokenBudget=100, maxSteps=3,
                         subAgents=["helper@1", "researcher@2"])
    assert (first["agentVersion"], first["system"], first["tokenBudget"], first["maxSteps"], first["subAgents"]) == (
        1, "mine", 100, 3, ["helper@1", "researcher@2"])
    plain = await run_of(client, tokenBudget=10, timeoutSeconds=10, subAgents=["helper"])
    assert (plain["agent"], plain["agentVersion"], plain["subAgents"]) == (None, None, ["helper@1"])
    none = await run_of(client, tokenBudget=10, timeoutSeconds=10)
    assert (none["agent"], none["agentVersion"], none["subAgents"]) == (None, None, None)


async def test_limits_may_only_be_lowered(client: httpx.AsyncClient, store: RunStore) -> None:
    await store.put_agent(RESEARCHER)
    r = await client.post("/api/runs", json={"input": "x", "agent": "researcher", "tokenBudget": 20_001,
                                             "maxSteps": 13, "costBudgetUsd": 2.5, "timeoutSeconds": 601})
    assert r.status_code == 422
    assert set(problems(r)) == {"tokenBudget", "maxSteps", "costBudgetUsd", "timeoutSeconds"}
    assert "researcher@1" in problems(r)["tokenBudget"]
    equal = await run_of(client, agent="researcher", tokenBudget=20_000, maxSteps=12, timeoutSeconds=600)
    assert equal["tokenBudget"] == 20_000


async def test_an_agent_without_budgets_needs_them_from_the_run(client: httpx.AsyncClient, store: RunStore) -> None:
    await store.put_agent(Agent(name="bare", version=0, system="hi"))
    r = await client.post("/api/runs", json={"input": "x", "agent": "bare"})
    assert r.status_code == 422 and set(problems(r)) == {"tokenBudget", "timeoutSeconds"}
    run = await run_of(client, agent="bare", tokenBudget=5, timeoutSeconds=5)
    assert (run["system"], run["agentVersion"]) == ("hi", 1)


async def test_unknown_agents_and_versions_are_404_naming_them(client: httpx.AsyncClient, store: RunStore) -> None:
    await store.put_agent(RESEARCHER)
    cases = [({"agent": "nobody"}, "agent", "nobody"), ({"agent": "researcher@2"}, "agent", "version 2"),
             ({"agent": "researcher", "subAgents": ["researcher", "ghost"]}, "subAgents[1]", "ghost")]
    for body, field, named in cases:
        r = await client.post("/api/runs", json={"input": "x", **body})
        assert r.status_code == 404, (body, r.text)
        assert named in problems(r)[field] and named in r.json()["error"]
    await store.delete_agent("researcher")
    r = await client.post("/api/runs", json={"input": "x", "agent": "researcher"})
    assert r.status_code == 404 and "agent" in problems(r)


async def test_malformed_references_are_422(client: httpx.AsyncClient) -> None:
    for body, field in (({"agent": "Bad_Name"}, "agent"), ({"agent": "a@0"}, "agent"), ({"agent": ""}, "agent"),
                        ({"agent": 3}, "agent"), ({"agent": "a@1@2"}, "agent"),
                        ({"subAgents": ["ok", "a@x"]}, "subAgents[1]"), ({"subAgents": "ok"}, "subAgents")):
        r = await client.post("/api/runs", json={"input": "x", "tokenBudget": 5, "timeoutSeconds": 5, **body})
        assert r.status_code == 422, (body, r.text)
        assert field in problems(r), (body, r.text)


async def test_a_continuation_and_a_fork_keep_the_pin(
    client: httpx.AsyncClient, store: RunStore, toolbox: ToolBox
) -> None:
    await store.put_agent(Agent(name="helper", version=0))
    await store.put_agent(Agent(**{**RESEARCHER.__dict__, "sub_agents": ("helper",)}))
    source = await run_of(client, agent="researcher")
    await worker(store, ScriptedLlm().then_text("done"), toolbox).run_once()
    await status_is(client, source["id"], "SUCCEEDED")
    # Both agents change; what goes on from the run keeps what it was pinned to.
    await store.put_agent(Agent(**{**RESEARCHER.__dict__, "system": "changed", "sub_agents": ("helper",)}))
    await store.put_agent(Agent(name="helper", version=0, system="changed"))
    after = await run_of(client, input="and then?", continueFrom=source["id"])
    fork = (await client.get(f"/api/runs/{(await client.post('/api/runs', json={'forkFrom': {'runId': source['id'], 'seq': 1}})).json()['id']}")).json()
    for run in (after, fork):
        assert (run["agent"], run["agentVersion"], run["subAgents"], run["system"]) == (
            "researcher", 1, ["helper@1"], "You research."), run
    # Its own sub-agents, given on the continuation, are pinned afresh.
    own = await run_of(client, input="more", continueFrom=source["id"], subAgents=["helper"])
    assert (own["agentVersion"], own["subAgents"]) == (1, ["helper@2"])
    # Naming an agent on a continuation is refused: it keeps its source's.
    r = await client.post("/api/runs", json={"input": "x", "continueFrom": source["id"], "agent": "researcher"})
    assert r.status_code == 422 and "agent" in problems(r)


async def test_an_idempotent_retry_after_an_edit_gets_the_first_run(client: httpx.AsyncClient, store: RunStore) -> None:
    await store.put_agent(RESEARCHER)
    key = {"Idempotency-Key": f"k-{uuid.uuid4()}"}
    first = await client.post("/api/runs", json={"input": "x", "agent": "researcher"}, headers=key)
    await store.put_agent(Agent(**{**RESEARCHER.__dict__, "system": "changed"}))
    again = await client.post("/api/runs", json={"input": "x", "agent": "researcher"}, headers=key)
    assert (first.status_code, again.status_code) == (201, 201), again.text
    assert again.json()["id"] == first.json()["id"] and again.headers["Idempotent-Replayed"] == "true"
    other = await client.post("/api/runs", json={"input": "x", "agent": "researcher@2"}, headers=key)
    assert other.status_code == 422 and "Idempotency-Key" in problems(other)


async def test_a_pinned_version_survives_an_edit_mid_run(
    store: RunStore, settings: WorkerSettings, metrics: Metrics
) -> None:
    """The agent is edited through the API (a new system prompt, tools and budget) by a tool while the run
    works: the model's next turn, the run and its continuation all keep version 1."""
    clients: list[httpx.AsyncClient] = []

    @tool(name="edit_agent", description="Edits the agent while the run works.")
    async def edit_agent(args: dict[str, Any], ctx: ToolContext) -> str:
        r = await clients[0].post("/api/agents", json={"name": "researcher", "system": "NEW PROMPT", "tools": [],
                                                       "tokenBudget": 1})
        assert r.status_code == 201, r.text
        return f"edited: version {r.json()['version']}"

    tools = ToolBox([edit_agent, lookup])
    async with asgi_client(make_app(store, tools, settings, metrics)) as client:
        clients.append(client)
        await store.put_agent(Agent(**{**RESEARCHER.__dict__, "tools": ("edit_agent", "lookup")}))
        run = (await client.post("/api/runs", json={"input": "work", "agent": "researcher"})).json()
        llm = ScriptedLlm().then_tool_use("toolu_1", "edit_agent").then_text("finished")
        await worker(store, llm, tools).run_once()
        done = await status_is(client, run["id"], "SUCCEEDED")
        assert (await store.agent("researcher") or RESEARCHER).system == "NEW PROMPT"
        assert [r.system for r in llm.seen] == ["You research.", "You research."]
        assert all({t["name"] for t in r.tools or []} == {"edit_agent", "lookup"} for r in llm.seen)
        assert (done["agentVersion"], done["system"], done["tokenBudget"], done["output"]) == (
            1, "You research.", 20_000, "finished")
        timeline = (await client.get(f"/api/runs/{run['id']}/timeline")).json()
        assert [s["kind"] for s in timeline] == ["MODEL", "TOOL", "MODEL"]
        # The continuation goes on with version 1's configuration too; a new run gets version 2.
        after = (await client.post("/api/runs", json={"input": "again", "continueFrom": run["id"]})).json()
        cont = ScriptedLlm().then_text("ok")
        await worker(store, cont, tools).run_once()
        cont_run = await status_is(client, after["id"], "SUCCEEDED")
        assert (cont_run["agentVersion"], cont.seen[0].system) == (1, "You research.")
        fresh = (await client.post("/api/runs", json={"input": "x", "agent": "researcher", "timeoutSeconds": 9})).json()
        assert (await client.get(f"/api/runs/{fresh['id']}")).json()["agentVersion"] == 2


async def test_a_run_resumed_after_a_crash_keeps_its_pin(
    client: httpx.AsyncClient, store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    """The worker dies mid-run (in a tool call); the agent is edited and then deleted; another worker
    resumes the run from its step log with the version it was pinned to."""
    await store.put_agent(RESEARCHER)
    run = (await client.post("/api/runs", json={"input": "work", "agent": "researcher"})).json()
    calls: list[str] = []

    @tool(name="lookup", description="finds things")
    async def crashing(args: dict[str, Any], ctx: ToolContext) -> str:
        calls.append(ctx.idempotency_key)
        if len(calls) == 1:
            raise SimulatedCrash()
        return "found"

    llm = ScriptedLlm().then_tool_use("toolu_1", "lookup").then_text("finished")
    with pytest.raises(SimulatedCrash):
        await worker(store, llm, [crashing], "worker-A").run_once()
    await store.put_agent(Agent(**{**RESEARCHER.__dict__, "system": "NEW", "tools": ()}))
    await store.delete_agent("researcher")
    await db.execute("UPDATE run SET locked_until = now() - interval '1 second' WHERE id = %s", (run["id"],))
    assert str(await worker(store, llm, [crashing], "worker-B").run_once()) == run["id"]
    done = await status_is(client, run["id"], "SUCCEEDED")
    assert [r.system for r in llm.seen] == ["You research.", "You research."] and calls == ["toolu_1", "toolu_1"]
    assert (done["agent"], done["agentVersion"], done["tools"]) == ("researcher", 1, ["lookup"])
