"""Every way a run is made goes through the one door and records which way it came, as `origin`: the API's
create, continue and fork (`api`), a schedule's tick (`schedule`), a parent's sub-agent call (`child`).
An AgentRun's (`operator`) is in tests/operator/test_origin.py."""

from __future__ import annotations

from typing import Any

import httpx
import psycopg

from agentrun.worker.core.records import Origin
from agentrun.worker.runtime.schedules import Ticker
from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm
from tests.support.api import status_is, submit
from tests.support.builders import new_run, worker
from tests.support.trees import finished_tree


async def origin(client: httpx.AsyncClient, run_id: object) -> Any:
    r = await client.get(f"/api/runs/{run_id}")
    assert r.status_code == 200, r.text
    return r.json()["origin"]


async def test_each_way_in_records_its_origin(
    client: httpx.AsyncClient, store: RunStore, db: psycopg.AsyncConnection[Any]
) -> None:
    first = await submit(client, input="say hello")
    assert await worker(store, ScriptedLlm().then_text("hello", in_=10, out=5)).run_once() is not None
    await status_is(client, first, "SUCCEEDED")
    continued = await submit(client, input="and then?", continueFrom=first)
    forked = (await client.post("/api/runs", json={"forkFrom": {"runId": first, "seq": 1}, "tokenBudget": 1000,
                                                   "timeoutSeconds": 60})).json()["id"]
    assert [await origin(client, r) for r in (first, continued, forked)] == ["api", "api", "api"]

    r = await client.post("/api/schedules", json={"name": "hourly", "intervalSeconds": 3600,
                                                  "run": {"input": "report", "tokenBudget": 1000, "timeoutSeconds": 60}})
    assert r.status_code == 201, r.text
    await db.execute("UPDATE schedule SET next_due_at = date_trunc('second', now()) WHERE name = 'hourly'")
    [tick] = await Ticker(store, "t1", "claude-sonnet-4-5").once()
    assert tick.outcome == "created" and await origin(client, tick.run_id) == "schedule"

    parent = await finished_tree(store, "researcher")
    [child] = await store.children(parent.id)
    assert child.origin == Origin.CHILD.value and await origin(client, child.id) == "child"


async def test_a_run_made_around_the_door_has_no_origin(client: httpx.AsyncClient, store: RunStore) -> None:
    """What a run made before origins were recorded shows (0022_origin.sql): null. Only tests make one so now."""
    run, _ = await store.create(new_run())
    assert run.origin is None and await origin(client, run.id) is None
