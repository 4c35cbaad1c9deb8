"""Agent definitions in the store (worker/store/agents.py), against real PostgreSQL: versions, identity,
races, deletion, and the pinned sub-agents a run gets."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from agentrun.worker.core.agents import Agent, parse_ref, with_agent
from agentrun.worker.core.errors import Refusal, Refused
from agentrun.worker.core.records import NewRun
from agentrun.worker.core.submission import RunSpec
from agentrun.worker.store import RunStore
from agentrun.worker.store.pool import open_pool


def _agent(name: str = "researcher", **kw: Any) -> Agent:
    fields: dict[str, Any] = dict(name=name, version=0, description="finds things", system="be thorough",
                                  model="claude-haiku-4-5", tools=("lookup",), token_budget=5000, max_steps=9,
                                  cost_budget_usd=Decimal("0.50"), timeout_seconds=60)
    fields.update(kw)
    return Agent(**fields)


async def test_versions_count_from_one_and_an_identical_body_makes_none(store: RunStore) -> None:
    first, created = await store.put_agent(_agent(), created_by="alice")
    assert (first.version, created, first.created_by) == (1, True, "alice")
    again, created = await store.put_agent(_agent(version=7, cost_budget_usd=Decimal("0.5")))
    assert (again.version, created) == (1, False)  # 0.50 and 0.5 are one budget; the version given is ignored
    second, created = await store.put_agent(_agent(system="be brief"))
    assert (second.version, created) == (2, True)
    assert (await store.agent("researcher")) == second
    assert (await store.agent("researcher", 1)) == first
    assert await store.agent("researcher", 3) is None
    assert await store.agent("nobody") is None
    assert [a.version for a in await store.agent_versions("researcher")] == [1, 2]
    # The definition is read back as it was put.
    assert first.tools == ("lookup",) and first.output_schema is None and first.sub_agents is None


async def test_every_field_round_trips(store: RunStore) -> None:
    full = _agent(require_approval=("*",), output_schema={"type": "object", "required": ["x"]},
                  sub_agents=("helper", "other@2"))
    stored, _ = await store.put_agent(full)
    assert stored == Agent(**{**full.__dict__, "version": 1, "created_at": stored.created_at})
    bare, _ = await store.put_agent(Agent(name="bare", version=0))
    assert (bare.system, bare.tools, bare.token_budget) == (None, None, None)


async def test_concurrent_identical_puts_make_one_version(database_url: str) -> None:
    # Two pools: each put on a connection of its own, racing on the same name.
    pools: list[AsyncConnectionPool[Any]] = [await open_pool(database_url, max_size=4) for _ in range(2)]
    try:
        stores = [RunStore(p) for p in pools]
        for round_ in range(5):
            agent = _agent(name=f"racer-{round_}")
            results = await asyncio.gather(*(s.put_agent(agent) for s in stores for _ in range(3)))
            assert {r[0].version for r in results} == {1}
            assert sum(created for _, created in results) == 1
            assert [a.version for a in await stores[0].agent_versions(agent.name)] == [1]
    finally:
        for p in pools:
            await p.close()


async def test_delete_hides_the_agent_and_a_put_undeletes_it(store: RunStore) -> None:
    await store.put_agent(_agent())
    await store.put_agent(_agent(name="other"))
    assert await store.delete_agent("researcher")
    assert not await store.delete_agent("researcher")  # already
    assert not await store.delete_agent("nobody")
    assert await store.agent("researcher") is None
    assert await store.agent("researcher", 1) is None
    assert (await store.agent("researcher", deleted=True) or _agent()).version == 1
    assert [a.name for a in await store.agents()] == ["other"]
    with pytest.raises(Refused) as refused:
        await store.for_run(RunSpec(input="hi", agent=("researcher", None)))
    assert refused.value.kind is Refusal.NOT_FOUND and refused.value.problems[0].field == "agent"
    # A new put undeletes it; the same definition is still version 1.
    back, created = await store.put_agent(_agent())
    assert (back.version, created) == (1, False)
    assert [a.name for a in await store.agents()] == ["other", "researcher"]


async def test_agents_lists_the_latest_of_each_by_name(store: RunStore) -> None:
    await store.put_agent(_agent(name="zeta"))
    await store.put_agent(_agent(name="alpha"))
    await store.put_agent(_agent(name="alpha", system="v2"))
    assert [(a.name, a.version) for a in await store.agents()] == [("alpha", 2), ("zeta", 1)]


async def test_sub_agents_are_pinned_and_unknown_ones_named(store: RunStore) -> None:
    await store.put_agent(_agent(name="helper"))
    await store.put_agent(_agent(name="helper", system="v2"))
    await store.put_agent(_agent(name="other"))
    assert await store.resolve_sub_agents(["helper", "other", "helper@1", "helper@2"]) == (
        "helper@2", "other@1", "helper@1")
    for names, field in ((["helper", "nobody"], "subAgents[1]"), (["helper@3"], "subAgents[0]")):
        with pytest.raises(Refused) as refused:
            await store.resolve_sub_agents(names)
        assert refused.value.kind is Refusal.NOT_FOUND and refused.value.problems[0].field == field
    with pytest.raises(Refused) as refused:
        await store.resolve_sub_agents(["Not_A_Name"])
    assert refused.value.kind is Refusal.INVALID and refused.value.problems[0].field == "subAgents[0]"


async def test_a_run_made_from_an_agent_stores_its_pin(store: RunStore) -> None:
    await store.put_agent(_agent(name="helper"))
    await store.put_agent(_agent(sub_agents=("helper",)))
    spec, agent, subs = await store.for_run(RunSpec(input="hi", agent=parse_ref("researcher@1"), token_budget=100))
    assert agent is not None and agent.version == 1 and subs == ("helper@1",)
    assert (spec.agent, spec.system, spec.token_budget, spec.max_steps) == (None, "be thorough", 100, 9)
    run, _ = await store.create(NewRun(input="hi", model="m", token_budget=100, timeout_seconds=60,
                                       agent="researcher", agent_version=1, sub_agents=subs))
    assert (run.agent, run.agent_version, run.sub_agents) == ("researcher", 1, ("helper@1",))
    plain, _ = await store.create(NewRun(input="hi", model="m", token_budget=100, timeout_seconds=60))
    assert (plain.agent, plain.agent_version, plain.sub_agents) == (None, None, None)


def test_parse_ref() -> None:
    assert parse_ref("researcher") == ("researcher", None)
    assert parse_ref("researcher@3") == ("researcher", 3)
    for bad in ("", "Researcher", "a@", "a@0", "a@-1", "a@x", "a@1@2", "-a", "a" * 64, "a@١", "a@99999999999"):
        with pytest.raises(Refused) as refused:
            parse_ref(bad)
        assert refused.value.kind is Refusal.INVALID and refused.value.problems[0].field == "agent"


def test_with_agent_fills_in_and_only_lowers() -> None:
    agent = _agent(version=2, require_approval=("lookup",), sub_agents=("helper",))
    spec = with_agent(RunSpec(input="hi", agent=("researcher", 2), system="mine", token_budget=10), agent)
    assert (spec.agent, spec.system, spec.model, spec.token_budget, spec.max_steps, spec.tools,
            spec.require_approval, spec.cost_budget_usd, spec.timeout_seconds, spec.sub_agents) == (
        None, "mine", "claude-haiku-4-5", 10, 9, ("lookup",), ("lookup",), Decimal("0.50"), 60, ("helper",))
    assert with_agent(RunSpec(sub_agents=("x",)), agent).sub_agents == ("x",)
    with pytest.raises(Refused) as refused:
        with_agent(RunSpec(token_budget=5001, max_steps=9, cost_budget_usd=Decimal("1"), timeout_seconds=61), agent)
    assert refused.value.kind is Refusal.INVALID
    assert [p.field for p in refused.value.problems] == ["tokenBudget", "costBudgetUsd", "timeoutSeconds"]
    # An agent with no budget leaves the run's free.
    assert with_agent(RunSpec(token_budget=10**9), Agent("bare", 1)).token_budget == 10**9


async def test_the_name_is_a_dns_label_in_the_database_too(db: psycopg.AsyncConnection[Any]) -> None:
    with pytest.raises(psycopg.errors.CheckViolation):
        await db.execute("INSERT INTO agent (name) VALUES ('Not_A_Label')")
