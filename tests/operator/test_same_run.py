"""The same spec makes the same run through the REST API and through an AgentRun: both go through the one
submission policy (worker/core/submission.py), so their rows differ only in ids, times and the link to
Kubernetes."""

from __future__ import annotations

import copy
import dataclasses
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from agentrun.operator import mapping
from agentrun.worker.api.app import create_app
from agentrun.worker.core import submission
from agentrun.worker.core.agents import Agent
from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.core.records import Run, RunStatus
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolBox, ToolContext, tool
from tests.support.builders import worker


@tool(name="lookup", description="Looks a thing up.")
def lookup(args: dict[str, Any], ctx: ToolContext) -> str:
    return "found"


@tool(name="noop", description="Does nothing.")
def noop(args: dict[str, Any], ctx: ToolContext) -> str:
    return "ok"


TOOLS = [lookup, noop]
# Not the same in both by construction: ids, times, and who made the run from where.
IGNORED = {"id", "created_at", "deadline_at", "k8s_namespace", "k8s_name", "created_by", "idempotency_key",
           "traceparent", "origin"}
# A run without a schedule becomes claimable when it is inserted: its own time too.
UNSCHEDULED = IGNORED | {"run_at"}
SOURCE_NAME = "source-agentrun"

SPECS: dict[str, dict[str, Any]] = {
    "minimal": {"input": "hello", "tokenBudget": 1000, "timeoutSeconds": 60},
    "budgets": {"input": "hello", "tokenBudget": 5000, "timeoutSeconds": 30, "maxSteps": 7, "costBudgetUsd": 0.25,
                "model": "claude-haiku-4-5", "system": "be brief"},
    "tools and approval": {"input": "hello", "tokenBudget": 1000, "timeoutSeconds": 60, "tools": ["lookup", "noop"],
                           "requireApproval": ["lookup"]},
    "output schema": {"input": "count", "tokenBudget": 1000, "timeoutSeconds": 60,
                      "outputSchema": {"type": "object", "properties": {"n": {"type": "integer"}},
                                       "required": ["n"]}},
    "schedule": {"input": "later", "tokenBudget": 1000, "timeoutSeconds": 60, "priority": 5,
                 "runAt": "2030-01-02T03:04:05Z"},
    "continuation": {"input": "and then?", "continueFrom": SOURCE_NAME},
    "continuation naming its budget": {"input": "and then?", "continueFrom": SOURCE_NAME, "tokenBudget": 777},
    "fork": {"forkFrom": {"name": SOURCE_NAME, "seq": 1}},
}


@pytest.fixture
async def api(store: RunStore) -> AsyncIterator[httpx.AsyncClient]:
    settings = WorkerSettings(database_url="unused", worker_id="api", default_model=submission.DEFAULT_MODEL)
    app = create_app(store, ToolBox(TOOLS), settings, None)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://agentrun.test") as client:
        yield client


async def _source(api: httpx.AsyncClient, store: RunStore) -> Run:
    """A SUCCEEDED run with its own budgets, tools and system prompt, for the continuation and the fork."""
    r = await api.post("/api/runs", json={"input": "first", "tokenBudget": 4321, "timeoutSeconds": 45,
                                          "maxSteps": 9, "tools": ["lookup"], "system": "be kind",
                                          "model": "claude-haiku-4-5", "costBudgetUsd": 0.5})
    assert r.status_code == 201, r.text
    await worker(store, ScriptedLlm().then_text("first answer", 10, 5), TOOLS).run_once()
    source = await store.get(uuid.UUID(r.json()["id"]))
    assert source is not None and source.status is RunStatus.SUCCEEDED
    return source


def _as_api_body(spec: dict[str, Any], source: Run) -> dict[str, Any]:
    body = copy.deepcopy(spec)
    if "continueFrom" in body:
        body["continueFrom"] = str(source.id)
    if "forkFrom" in body:
        body["forkFrom"] = {"runId": str(source.id), "seq": body["forkFrom"]["seq"]}
    return body


def _compared(run: Run, ignored: set[str]) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(run).items() if k not in ignored}


@pytest.mark.parametrize("name", list(SPECS))
async def test_the_api_and_the_operator_make_the_same_run(name: str, api: httpx.AsyncClient, store: RunStore) -> None:
    spec = SPECS[name]
    source = await _source(api, store) if {"continueFrom", "forkFrom"} & set(spec) else None
    r = await api.post("/api/runs", json=_as_api_body(spec, source) if source else spec)
    assert r.status_code == 201, r.text
    through_api = await store.get(uuid.UUID(r.json()["id"]))

    # As the operator's create handler does: the source looked up by name, then the mapping.
    new = mapping.new_run(spec, str(uuid.uuid4()), "default", f"same-{len(name)}", {t.name for t in TOOLS},
                          PriceTable.load(), source)
    through_operator, created = await store.create(new)
    assert created and through_api is not None
    ignored = IGNORED if "runAt" in spec else UNSCHEDULED
    assert _compared(through_operator, ignored) == _compared(through_api, ignored)
    if source is not None and "tokenBudget" not in spec:  # what a user expects of a continuation or fork
        assert (through_api.token_budget, through_api.timeout_seconds, through_api.max_steps, through_api.tools,
                through_api.model) == (4321, 45, 9, ("lookup",), "claude-haiku-4-5")


@pytest.mark.parametrize("spec", [
    {"input": "hello", "agentRef": {"name": "researcher"}},
    {"input": "hello", "agentRef": {"name": "researcher", "version": 1}, "maxSteps": 3, "system": "mine"},
], ids=["latest", "pinned, lowered"])
async def test_an_agent_makes_the_same_run_through_both(spec: dict[str, Any], api: httpx.AsyncClient,
                                                         store: RunStore) -> None:
    await store.put_agent(Agent("researcher", 0, system="v1", model="claude-haiku-4-5", tools=("lookup",),
                                token_budget=5000, timeout_seconds=60, max_steps=7))
    await store.put_agent(Agent("researcher", 0, system="v2", model="claude-haiku-4-5", tools=("noop",),
                                token_budget=6000, timeout_seconds=60, max_steps=7))
    ref = spec["agentRef"]
    body = {k: v for k, v in spec.items() if k != "agentRef"}
    body["agent"] = ref["name"] + (f"@{ref['version']}" if "version" in ref else "")
    r = await api.post("/api/runs", json=body)
    assert r.status_code == 201, r.text
    through_api = await store.get(uuid.UUID(r.json()["id"]))

    # As the operator's create handler does: the spec, the agent applied by the store, then the mapping.
    resolved = await store.for_run(mapping.run_spec(spec, None))
    new = mapping.new_run(spec, str(uuid.uuid4()), "default", "same-agent", {t.name for t in TOOLS},
                          PriceTable.load(), None, resolved=resolved)
    through_operator, created = await store.create(new)
    assert created and through_api is not None
    assert _compared(through_operator, UNSCHEDULED) == _compared(through_api, UNSCHEDULED)
    assert through_api.agent == "researcher" and through_api.agent_version == ref.get("version", 2)
