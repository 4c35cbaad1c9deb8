"""Each tenant's load on /metrics: its runs by status, the runs its quotas hold back, and what it spent in the
rolling day, read from the database."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from agentrun.worker.obs.metrics import Metrics
from agentrun.worker.store import RunStore
from tests.support.builders import new_run


async def test_the_tenant_gauges_count_each_tenants_runs_spend_and_throttled(store: RunStore) -> None:
    for _ in range(3):
        await store.create(new_run(tenant="team-a"))
    held, _ = await store.create(new_run(tenant="team-b"))
    await store.create(new_run(tenant="team-b", delay_seconds=3600))  # not ready: not held back by maxRunning
    assert (await store.claim("w", 30)) is not None  # one of team-a's (the oldest)
    async with store.pool.connection() as conn:
        await conn.execute("UPDATE tenant SET max_running = 1 WHERE name = 'team-a'")
        await conn.execute("UPDATE run SET throttled = '{\"quota\": \"tokensPerDay\"}' WHERE id = %s", (held.id,))
        await conn.execute("""INSERT INTO tenant_usage (tenant, minute, worker, tokens, cost_usd) VALUES
            ('team-b', date_trunc('minute', now()), 'w', 100, 0.5), ('team-b', now() - interval '2 minutes', 'v', 20, 0.25),
            ('team-b', now() - interval '2 days', 'w', 999, 9)""")
    metrics = Metrics(count_runs=store.count_by_status, count_tenants=store.count_by_tenant, cache_seconds=0)
    text = (await metrics.exposition()).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}

    def of(name: str, tenant: str, **labels: str) -> float:
        return samples[(name, tuple(sorted({"tenant": tenant, **labels}.items())))]

    assert of("agentrun_tenant_runs", "team-a", status="QUEUED") == 2
    assert of("agentrun_tenant_runs", "team-a", status="RUNNING") == 1
    assert of("agentrun_tenant_runs", "team-b", status="QUEUED") == 2
    assert of("agentrun_tenant_throttled_runs", "team-a") == 2  # ready, and the tenant is at its maxRunning
    assert of("agentrun_tenant_throttled_runs", "team-b") == 1  # marked by its daily budget
    assert of("agentrun_tenant_throttled_runs", "default") == 0
    assert (of("agentrun_tenant_tokens_day", "team-b"), of("agentrun_tenant_cost_usd_day", "team-b")) == (120, 0.75)
