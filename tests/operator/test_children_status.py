"""An AgentRun whose run has sub-agents counts its children in its status, with its tree's totals:
the real kopf operator, an emulated API server, real PostgreSQL and in-process workers."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import pytest

from agentrun.worker.store import RunStore
from agentrun.worker.testing.scripted import ScriptedLlm, TreeLlm
from tests.support.builders import worker
from tests.support.cluster import Cluster, uid_of
from tests.support.running import finished, running
from tests.support.trees import define
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("operator")


async def test_an_agentruns_status_counts_its_children_and_totals(cluster: Cluster, store: RunStore) -> None:
    obj = await cluster.create("planner", input="the question", system="planner")
    uid = uid_of(obj)

    async def exists() -> bool:
        return await store.get(uid) is not None

    await eventually(exists, 60, "the run row")
    # Until the AgentRun spec names an agent (agentRef), the sub-agents are given to the row directly,
    # before any worker claims it.
    refs = [await define(store, "researcher"), await define(store, "writer")]
    async with store.pool.connection() as conn:
        await conn.execute("UPDATE run SET sub_agents = %s WHERE id = %s", (refs, uid))

    hold = asyncio.Event()
    async with running(worker(store, TreeLlm(hold=hold), concurrency=3)):
        def waiting(s: dict[str, Any]) -> bool:
            return s.get("phase") == "Waiting" and s.get("children", {}).get("active") == 2

        status = await cluster.wait_status("planner", "Waiting for its children", waiting)
        assert status["children"] == {"total": 2, "active": 2, "succeeded": 0, "failed": 0}
        assert status["message"] == "waiting for 2 sub-agent runs (see status.children)"
        assert status["pending"] == []  # nothing waits for a person
        assert status["tokensUsedTotal"] >= status["tokensUsed"]
        hold.set()
        done = await finished(store, uid, 60)

    def succeeded(s: dict[str, Any]) -> bool:
        return s.get("phase") == "Succeeded" and s.get("children", {}).get("succeeded") == 2

    status = await cluster.wait_status("planner", "Succeeded with both children", succeeded)
    assert status["children"] == {"total": 2, "active": 0, "succeeded": 2, "failed": 0}
    assert (status["tokensUsed"], status["tokensUsedTotal"]) == (done.tokens_used, done.tokens_used_total)
    assert done.tokens_used_total > done.tokens_used
    assert Decimal(status["costUsdTotal"]) == done.cost_usd_total > done.cost_usd


async def test_a_run_without_sub_agents_shows_no_children(cluster: Cluster, store: RunStore) -> None:
    obj = await cluster.create("plain", input="hi")

    async def exists() -> bool:
        return await store.get(uid_of(obj)) is not None

    await eventually(exists, 60, "the run row")
    await worker(store, ScriptedLlm().then_text("hello")).run_once()
    status = await cluster.wait_status("plain", "Succeeded", lambda s: s.get("phase") == "Succeeded")
    assert not {"children", "tokensUsedTotal", "costUsdTotal"} & status.keys()
