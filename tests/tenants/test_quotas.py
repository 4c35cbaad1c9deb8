"""Tenants' quotas (issue 46, section 2): a submit over `maxQueued` or a daily budget is refused with a 429
naming the quota, exactly under concurrent submits; a change applies at once; a schedule's tick refused
tries again at the next."""

from __future__ import annotations

import asyncio
import datetime
import uuid
from decimal import Decimal

import httpx
import pytest

from agentrun.worker.core.errors import OverQuota
from agentrun.worker.core.records import ModelTurn, NewRun, RunStatus
from agentrun.worker.core.tenants import Quotas
from agentrun.worker.core.types import Usage
from agentrun.worker.runtime.schedules import Ticker
from agentrun.worker.settings import tenant_quotas
from agentrun.worker.store import LeaseLost, RunStore
from agentrun.worker.store.retention import prune_if_first
from agentrun.worker.testing.scripted import TreeLlm, TurnBasedLlm
from tests.support.api import noop
from tests.support.builders import MODEL, worker
from tests.support.running import finished, running
from tests.support.trees import planner
from tests.support.waiting import eventually


def new(tenant: str = "team-a", key: str | None = None, **kw: object) -> NewRun:
    fields: dict[str, object] = {"input": "hi", "model": "m", "token_budget": 1000, "timeout_seconds": 60,
                                 "idempotency_key": key, "tenant": tenant}
    return NewRun(**{**fields, **kw})  # type: ignore[arg-type]


async def spent(store: RunStore, tenant: str, tokens: int, cost: str = "0", minutes_ago: int = 0,
                worker: str = "w") -> None:
    """Usage rows as the workers' model steps write them, dated `minutes_ago` (time driven, not slept)."""
    async with store.pool.connection() as conn:
        await conn.execute(
            """INSERT INTO tenant_usage (tenant, minute, worker, tokens, cost_usd)
               VALUES (%s, date_trunc('minute', now()) - make_interval(mins => %s), %s, %s, %s)""",
            (tenant, minutes_ago, worker, tokens, Decimal(cost)))


async def queued(store: RunStore, tenant: str) -> int:
    async with store.pool.connection() as conn:
        row = await (await conn.execute(
            "SELECT count(*) FROM run WHERE tenant = %s AND status = 'QUEUED'", (tenant,))).fetchone()
    assert row is not None
    return int(row[0])


async def test_over_max_queued_a_submit_is_refused_naming_the_quota(store: RunStore) -> None:
    await store.set_quotas("team-a", Quotas(max_queued=2))
    for _ in range(2):
        await store.create(new())
    with pytest.raises(OverQuota) as refused:
        await store.create(new())
    assert refused.value.quota == "maxQueued" and refused.value.retry_after > 0
    assert "maxQueued is 2" in refused.value.message
    assert await queued(store, "team-a") == 2
    # Delayed and scheduled runs are queued too; another tenant is not held by it.
    assert (await store.create(new("team-b")))[1]


async def test_a_retry_of_a_run_made_already_is_answered_with_it_even_at_the_limit(store: RunStore) -> None:
    await store.set_quotas("team-a", Quotas(max_queued=1))
    first, created = await store.create(new(key="k"))
    again, created_again = await store.create(new(key="k"))
    assert created and not created_again and again.id == first.id


async def test_a_delayed_run_counts_as_queued(store: RunStore) -> None:
    await store.set_quotas("team-a", Quotas(max_queued=1))
    await store.create(new(delay_seconds=3600))
    with pytest.raises(OverQuota):
        await store.create(new())


@pytest.mark.parametrize("round_", range(3))
async def test_concurrent_submits_racing_max_queued_never_overshoot(store: RunStore, round_: int) -> None:
    await store.set_quotas("team-a", Quotas(max_queued=10))

    async def one() -> bool:
        try:
            await store.create(new())
            return True
        except OverQuota:
            return False

    made = await asyncio.gather(*(one() for _ in range(30)))
    assert sum(made) == 10
    assert await queued(store, "team-a") == 10


async def test_a_tenant_without_limits_takes_no_lock(store: RunStore) -> None:
    """Two submits of a tenant without quotas go through while another transaction holds its quota lock."""
    from agentrun.worker.store.channels import QUOTA_LOCK_CLASS

    await store.create(new())
    async with store.pool.connection() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext('team-a'))", (QUOTA_LOCK_CLASS,))
        async with asyncio.timeout(10):
            await asyncio.gather(store.create(new()), store.create(new()))


@pytest.mark.parametrize(("quotas", "tokens", "cost", "quota"), [
    (Quotas(tokens_per_day=1000), 1000, "0", "tokensPerDay"),
    (Quotas(cost_per_day_usd=Decimal("2.5")), 10, "2.5", "costPerDayUsd"),
])
async def test_at_a_daily_budget_a_submit_is_refused_until_the_window_allows(
    store: RunStore, quotas: Quotas, tokens: int, cost: str, quota: str,
) -> None:
    await store.create(new())
    await store.set_quotas("team-a", quotas)
    # Spent 30 minutes short of a day ago and just now: the old part leaves the window in 30 minutes.
    await spent(store, "team-a", tokens, cost, minutes_ago=1440 - 30)
    with pytest.raises(OverQuota) as refused:
        await store.create(new())
    assert refused.value.quota == quota
    assert 29 * 60 - 5 <= refused.value.retry_after <= 30 * 60 + 5
    # What a day ago and more spent counts no more.
    async with store.pool.connection() as conn:
        await conn.execute("UPDATE tenant_usage SET minute = minute - interval '31 minutes'")
    assert (await store.create(new()))[1]


async def test_a_change_takes_effect_at_the_next_submit(store: RunStore) -> None:
    await store.set_quotas("team-a", Quotas(max_queued=1))
    await store.create(new())
    with pytest.raises(OverQuota):
        await store.create(new())
    await store.set_quotas("team-a", Quotas(max_queued=None))
    assert (await store.create(new()))[1]


async def test_the_tenants_quotas_and_usage_read_back(store: RunStore) -> None:
    await store.create(new())
    await store.create(new(run_at=datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)))
    assert (await store.tenant("team-a")) is not None
    set_ = await store.set_quotas("team-a", Quotas(max_running=5, max_queued=2, tokens_per_day=10**9,
                                                   cost_per_day_usd=Decimal("200"), weight=2.5))
    await spent(store, "team-a", 300, "0.25", minutes_ago=10, worker="a")
    await spent(store, "team-a", 200, "0.25", minutes_ago=10, worker="b")
    await spent(store, "team-a", 999, "9", minutes_ago=1441)  # out of the window
    t = await store.tenant("team-a")
    assert t is not None and set_.configured_at is not None
    assert t.quotas == Quotas(5, 2, 10**9, Decimal("200"), 2.5)
    assert (t.queued, t.running, t.tokens_today, t.cost_today_usd) == (2, 0, 500, Decimal("0.5"))
    assert t.over is not None and t.over.quota == "maxQueued"
    assert [x.name for x in await store.tenants()] == ["default", "team-a"]
    assert await store.tenant("nobody") is None
    with pytest.raises(ValueError, match="weight"):
        await store.set_quotas("team-a", Quotas(weight=0))


async def test_seeded_quotas_apply_only_to_tenants_never_set_through_the_api(store: RunStore) -> None:
    await store.set_quotas("team-a", Quotas(max_queued=7))
    applied = await store.seed_quotas({"team-a": Quotas(max_queued=1), "team-b": Quotas(max_queued=3)})
    assert applied == ["team-b"]
    a, b = await store.tenant("team-a"), await store.tenant("team-b")
    assert a is not None and a.quotas.max_queued == 7
    assert b is not None and b.quotas.max_queued == 3 and b.configured_at is None
    # The next rollout's values apply to team-b again.
    await store.seed_quotas({"team-b": Quotas(max_queued=4)})
    b = await store.tenant("team-b")
    assert b is not None and b.quotas.max_queued == 4


async def test_the_api_answers_429_with_retry_after_naming_the_quota(store: RunStore,
                                                                       client: httpx.AsyncClient) -> None:
    await store.set_quotas("default", Quotas(max_queued=1))
    body = {"input": "hi", "tokenBudget": 100, "timeoutSeconds": 60}
    assert (await client.post("/api/runs", json=body)).status_code == 201
    r = await client.post("/api/runs", json=body)
    assert r.status_code == 429, r.text
    assert int(r.headers["Retry-After"]) >= 1
    answer = r.json()
    assert answer["quota"] == "maxQueued" and answer["retryAfter"] == int(r.headers["Retry-After"])
    assert "maxQueued" in answer["error"] and answer["fields"] == []
    await store.set_quotas("default", Quotas(tokens_per_day=100))
    await spent(store, "default", 100, minutes_ago=1440 - 2)
    r = await client.post("/api/runs", json=body)
    assert r.status_code == 429 and r.json()["quota"] == "tokensPerDay"
    assert 60 <= int(r.headers["Retry-After"]) <= 125
    await store.set_quotas("default", Quotas(cost_per_day_usd=Decimal("1")))
    await spent(store, "default", 0, "1", minutes_ago=5)
    r = await client.post("/api/runs", json=body)
    assert r.status_code == 429 and r.json()["quota"] == "costPerDayUsd"


async def test_a_tick_refused_by_a_quota_is_recorded_and_the_next_tries_again(
    store: RunStore, client: httpx.AsyncClient,
) -> None:
    ticker = Ticker(store, "t1", "claude-sonnet-4-5")
    run = {"input": "report", "tokenBudget": 1000, "timeoutSeconds": 60}
    assert (await client.post("/api/schedules", json={"name": "hourly", "intervalSeconds": 3600,
                                                      "run": run})).status_code == 201
    await store.set_quotas("default", Quotas(max_queued=0))
    async with store.pool.connection() as conn:
        await conn.execute("UPDATE schedule SET next_due_at = date_trunc('second', now()) - interval '10 seconds'")
    ticks = await ticker.once()
    assert [t.outcome for t in ticks] == ["failed"]
    view = (await client.get("/api/schedules/hourly")).json()
    assert "maxQueued" in view["lastError"] and view["nextScheduleTime"] is not None
    # The quota lifted, the next tick makes its run and clears the error.
    await store.set_quotas("default", Quotas())
    async with store.pool.connection() as conn:
        await conn.execute("UPDATE schedule SET next_due_at = date_trunc('second', now())")
    assert [t.outcome for t in await ticker.once()] == ["created"]
    assert (await client.get("/api/schedules/hourly")).json()["lastError"] is None


# -- usage: each model step's tokens and cost, once -----------------------------------------------------


async def usage(store: RunStore, tenant: str) -> tuple[int, Decimal]:
    async with store.pool.connection() as conn:
        row = await (await conn.execute(
            "SELECT coalesce(sum(tokens), 0), coalesce(sum(cost_usd), 0) FROM tenant_usage WHERE tenant = %s",
            (tenant,))).fetchone()
    assert row is not None
    return int(row[0]), Decimal(row[1])


async def test_each_model_step_is_counted_once_in_its_tenants_usage(store: RunStore) -> None:
    """Many runs of two tenants driven by a worker (their checkpoints batched together): the tenants' usage is
    what their runs' counters say, to the token."""
    for i in range(12):
        await store.create(new("team-a" if i % 2 else "team-b", model=MODEL))
    async with running(worker(store, TurnBasedLlm(2), [noop], concurrency=8)):
        async def all_done() -> bool:
            return all(r.status is RunStatus.SUCCEEDED for r in await store.list_runs())
        await eventually(all_done, 60, "every run to succeed")
    for tenant in ("team-a", "team-b"):
        runs = [r for r in await store.list_runs() if r.tenant == tenant]
        assert await usage(store, tenant) == (sum(r.tokens_used for r in runs), sum(r.cost_usd for r in runs))
        assert sum(r.tokens_used for r in runs) == 6 * 3 * 15


async def test_a_checkpoint_sent_again_after_its_answer_was_lost_counts_no_usage_twice(store: RunStore) -> None:
    await store.create(new())
    [claim] = await store.claim_many("w", 30, limit=1)
    turn = ModelTurn("{}", '[{"type":"text","text":"x"}]', "end_turn", Usage(10, 5, 0, 0), Decimal("0.01"), 0)
    wid = uuid.uuid4()
    await store.checkpoint_model(claim.run.id, "w", 30, turn, write_id=wid, epoch=claim.run.lease_epoch)
    await store.checkpoint_model(claim.run.id, "w", 30, turn, write_id=wid, epoch=claim.run.lease_epoch, again=True)
    assert await usage(store, "team-a") == (15, Decimal("0.01"))
    # A crash before the step's write commits counts nothing: a write refused by the fence adds nothing either.
    with pytest.raises(LeaseLost):
        await store.checkpoint_model(claim.run.id, "other", 30, turn, epoch=claim.run.lease_epoch)
    assert await usage(store, "team-a") == (15, Decimal("0.01"))


async def test_a_crash_mid_run_replays_without_counting_a_step_twice(store: RunStore) -> None:
    """A worker dies after its model step is checkpointed, before it runs the tool asked for: the next worker
    replays the step from the log (no model call, no usage again) and the tenant's usage is the run's
    counters."""
    run, _ = await store.create(new(model=MODEL))
    [claim] = await store.claim_many("w1", 30, limit=1)
    asked = '[{"type":"tool_use","id":"toolu_0_0","name":"noop","input":{}}]'
    turn = ModelTurn("{}", asked, "tool_use", Usage(10, 5, 0, 0), None, 0)
    await store.checkpoint_model(run.id, "w1", 30, turn, epoch=claim.run.lease_epoch)
    async with store.pool.connection() as conn:  # w1 is gone: its lease lapses
        await conn.execute("UPDATE run SET locked_until = now() - interval '1 second' WHERE id = %s", (run.id,))
    llm = TurnBasedLlm(1)
    async with running(worker(store, llm, [noop], name="w2")):
        done = await finished(store, run.id)
    assert done.status is RunStatus.SUCCEEDED and llm.calls == 1  # the first step was not asked again
    assert await usage(store, "team-a") == (done.tokens_used, done.cost_usd) and done.tokens_used == 2 * 15


async def test_usage_older_than_a_day_is_pruned(store: RunStore) -> None:
    await spent(store, "team-a", 5, minutes_ago=1441)
    await spent(store, "team-a", 7, minutes_ago=1430)
    pruned = await prune_if_first(store.pool, None)
    assert pruned is not None and pruned.rows.get("tenant_usage") == 1
    assert await usage(store, "team-a") == (7, Decimal(0))


# -- a daily budget spent mid-run ----------------------------------------------------------------------------


async def test_a_run_over_its_tenants_budget_is_handed_back_showing_why_and_resumes_when_the_window_allows(
    store: RunStore, client: httpx.AsyncClient,
) -> None:
    run, _ = await store.create(new(model=MODEL, token_budget=100_000, timeout_seconds=3600))
    await store.set_quotas("team-a", Quotas(tokens_per_day=1000))
    # The whole budget spent 1,437 minutes ago: the window allows again in 3 minutes or less.
    await spent(store, "team-a", 1000, minutes_ago=1440 - 3)
    llm = TurnBasedLlm(1)
    async with running(worker(store, llm, [noop])):
        async def held_back() -> bool:
            r = await store.get(run.id)
            return r is not None and r.status is RunStatus.QUEUED and r.throttled is not None
        await eventually(held_back, 30, "the run to be handed back for its tenant's budget")
        view = (await client.get(f"/api/runs/{run.id}")).json()
        assert view["status"] == "QUEUED" and llm.calls == 0
        throttled = view["throttled"]
        assert throttled["quota"] == "tokensPerDay" and "1000" in throttled["reason"]
        until = datetime.datetime.fromisoformat(throttled["until"])
        now = datetime.datetime.now(datetime.UTC)
        assert now < until <= now + datetime.timedelta(minutes=3, seconds=5)
        held = await store.get(run.id)
        assert held is not None and held.run_at == until and held.crashes == 0
        # Time passes: the spending leaves the window, and the run's time to be claimed again comes.
        async with store.pool.connection() as conn:
            await conn.execute("UPDATE tenant_usage SET minute = minute - interval '4 minutes'")
            await conn.execute("UPDATE run SET run_at = now() WHERE id = %s", (run.id,))
        done = await finished(store, run.id)
    assert done.status is RunStatus.SUCCEEDED and done.throttled is None and llm.calls == 2


async def test_a_run_held_back_past_its_own_deadline_ends_timed_out(store: RunStore) -> None:
    run, _ = await store.create(new(model=MODEL, timeout_seconds=2))
    await store.set_quotas("team-a", Quotas(cost_per_day_usd=Decimal("1")))
    await spent(store, "team-a", 0, "5", minutes_ago=10)  # allows again in almost a day
    async with running(worker(store, TurnBasedLlm(1), [noop])):
        done = await finished(store, run.id)
    # Held back until its deadline, then claimed (no longer held back) and ended by it.
    assert done.status is RunStatus.TIMED_OUT and done.throttled is None


async def test_a_quota_raised_lets_held_runs_go_on_within_a_second(store: RunStore) -> None:
    run, _ = await store.create(new(model=MODEL, timeout_seconds=3600))
    await store.set_quotas("team-a", Quotas(tokens_per_day=10))
    await spent(store, "team-a", 10, minutes_ago=1)
    llm = TurnBasedLlm(1)
    async with running(worker(store, llm, [noop])):
        async def held_back() -> bool:
            r = await store.get(run.id)
            return r is not None and r.throttled is not None
        await eventually(held_back, 30, "the run to be handed back")
        await store.set_quotas("team-a", Quotas(tokens_per_day=None))
        async with store.pool.connection() as conn:  # its time to be claimed again is a day away: bring it
            await conn.execute("UPDATE run SET run_at = now() WHERE id = %s", (run.id,))
        done = await finished(store, run.id)
    assert done.status is RunStatus.SUCCEEDED


@pytest.mark.parametrize(("text", "says"), [
    ('{"Team": {}}', "not a tenant name"),
    ('{"a": {"maxQueued": -1}}', "maxQueued: must be 0 or more"),
    ('{"a": {"tokensPerDay": 1.5}}', "tokensPerDay: must be a whole number"),
    ('{"a": {"weight": 0}}', "weight: must be at least 0.001"),
    ('{"a": {"maxQueue": 1}}', "unknown: maxQueue"),
    ("[1]", "must be a JSON object"),
    ("{", "is not JSON"),
])
def test_bad_initial_quotas_are_refused_naming_the_entry(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        tenant_quotas(text)


async def test_a_runs_sub_agents_are_part_of_it_never_refused_by_max_queued(store: RunStore) -> None:
    """The parent was admitted; its children count as queued but are not refused, though the tenant's queue
    is full with them."""
    parent = await planner(store, "researcher", "writer")  # tenant `default`
    await store.set_quotas("default", Quotas(max_queued=1))
    async with running(worker(store, TreeLlm(), concurrency=1)):
        done = await finished(store, parent.id, 60)
    assert done.status is RunStatus.SUCCEEDED, done.error
    assert [c.status for c in await store.children(parent.id)] == [RunStatus.SUCCEEDED] * 2
