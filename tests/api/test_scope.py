"""Every route of the OpenAPI document reads runs only through the scoped door (store/scoped.py), so that what a
caller may see (today every run; with tenants, its tenant's) is one rule in one place. A store that notes each
read of runs made straight from the API's code stands under the app; every operation is called, with a run
that has steps, decisions, messages and a sub-agent, and again with a run that does not exist."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from agentrun.worker.core.agents import Agent
from agentrun.worker.core.recording import NewReplay
from agentrun.worker.core.records import DecisionKind
from agentrun.worker.core.submission import Caller
from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.runtime.door import Door
from agentrun.worker.settings import WorkerSettings
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolBox
from tests.support.api import make_app
from tests.support.builders import new_run, worker
from tests.support.serving import asgi_client

# The store's reads of runs and of a run's rows: a route must reach each only through ScopedReads.
READS = ("get", "list_runs", "steps", "steps_before", "step", "timeline", "decisions", "messages", "children",
         "children_counts", "pending_wait", "webhooks_of", "get_many", "schedule_runs", "find_linked",
         "unfinished_linked", "wait_state")


class Watched(RunStore):
    """A RunStore that notes each read of runs called from the API's modules, not through the scoped door."""

    unscoped: list[str]


def _watch(name: str) -> Callable[..., Any]:
    async def read(self: Watched, *args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith("agentrun.worker.api"):
            self.unscoped.append(f"{caller} called store.{name}")
        return await getattr(RunStore, name)(self, *args, **kwargs)

    return read


for _name in READS:
    setattr(Watched, _name, _watch(_name))


@pytest.fixture
async def world(store: RunStore) -> dict[str, str]:
    """A finished run with a model step and a tool step, a run waiting for a decision, an agent, a schedule."""
    done, _ = await store.create(new_run("look it up"))
    llm = ScriptedLlm().then_tool_use("toolu_1", "noop", {}, 10, 5).then_text("done", 10, 5)
    await worker(store, llm, ToolBox([])).run_once()
    waiting, _ = await store.create(new_run("ask first"))
    claimed = await store.claim("w", 30)
    assert claimed is not None and claimed.run.id == waiting.id
    await store.park(waiting.id, "w", [("toolu_2", DecisionKind.APPROVAL, "noop", "{}", 0)])
    await store.put_agent(Agent(name="helper", version=0, system="helper"))
    replay = NewReplay(id=uuid.uuid4(), request={"runs": [str(done.id)]})
    finished = await store.get(done.id)
    assert finished is not None
    await Door(store).replay(replay, [finished], Caller())
    return {"done": str(done.id), "waiting": str(waiting.id), "replay": str(replay.id)}


def _operations(document: dict[str, Any]) -> list[tuple[str, str]]:
    return [(method.upper(), path) for path, ops in document["paths"].items() for method in ops]


def _body(method: str, path: str, ids: dict[str, str]) -> dict[str, Any] | None:
    if method not in ("POST", "PUT", "PATCH"):
        return None
    if path == "/api/runs":
        return {"input": "go on", "tokenBudget": 1000, "timeoutSeconds": 60, "continueFrom": ids["done"]}
    if path.endswith("/messages"):
        return {"text": "hello"}
    if path.endswith("/pending/{toolUseId}"):
        return {"decision": "approve"}
    if path == "/api/schedules":
        return {"name": "nightly", "cron": "0 3 * * *", "run": {"input": "x", "tokenBudget": 1000,
                                                                 "timeoutSeconds": 60}}
    if path == "/api/agents":
        return {"name": "helper2"}
    if path == "/api/events":
        return {"key": "k", "payload": 1}
    if path == "/api/replays":
        return {"runs": [ids["done"]]}
    return {}


def _url(path: str, run_id: str) -> str:
    return (path.replace("{id}", run_id).replace("{seq}", "1").replace("{toolUseId}", "toolu_2")
            .replace("{name}", "helper").replace("{n}", "1"))


async def test_every_route_reads_runs_only_through_the_scoped_door(
    store: RunStore, toolbox: ToolBox, settings: WorkerSettings, metrics: Metrics, world: dict[str, str],
) -> None:
    watched = Watched(store.pool)
    watched.unscoped = []
    app = make_app(watched, toolbox, settings, metrics)
    operations = _operations(app.openapi())
    assert len(operations) >= 30  # the whole document, not a chosen few
    answered: dict[tuple[str, str], int] = {}
    async with asgi_client(app) as client:
        for method, path in operations:
            alive = "pending" in path or path.endswith(("/cancel", "/messages")) and method == "POST"
            run_id = world["waiting"] if alive else world["replay"] if path.startswith("/api/replays/") else world["done"]
            r = await client.request(method, _url(path, run_id), json=_body(method, path, world))
            assert r.status_code < 500, (method, path, r.status_code, r.text)
            answered[(method, path)] = r.status_code
    assert watched.unscoped == [], "\n".join(watched.unscoped)
    reads_a_run = [op for op in operations if "{id}" in op[1]]
    assert reads_a_run and all(200 <= answered[op] < 300 for op in reads_a_run), {
        op: answered[op] for op in reads_a_run if not 200 <= answered[op] < 300}


async def test_a_run_that_is_not_there_is_a_404_on_every_route_of_a_run(
    store: RunStore, toolbox: ToolBox, settings: WorkerSettings, metrics: Metrics, world: dict[str, str],
) -> None:
    """What a caller may not see reads as no run: the same 404 as a run that does not exist (with tenants, a
    run of another tenant), on every route that names one."""
    app = make_app(store, toolbox, settings, metrics)
    nobody = str(uuid.uuid4())
    operations = [op for op in _operations(app.openapi()) if "{id}" in op[1]]
    async with asgi_client(app) as client:
        for method, path in operations:
            r = await client.request(method, _url(path, nobody), json=_body(method, path, world))
            assert r.status_code == 404, (method, path, r.status_code, r.text)
    async with asgi_client(app) as client:
        for field, body in (("continueFrom", {"continueFrom": nobody}),
                            ("forkFrom", {"forkFrom": {"runId": nobody, "seq": 1}})):
            r = await client.post("/api/runs", json={"tokenBudget": 1000, "timeoutSeconds": 60,
                                                     **({"input": "x"} if field == "continueFrom" else {}), **body})
            assert r.status_code == 404, (field, r.text)
