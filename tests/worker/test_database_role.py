"""docs/database-role.sql is enough: a worker connected as the runtime role drives a run to its end, and
that role can neither change the schema nor delete anything."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import errors, sql
from psycopg.conninfo import make_conninfo

from agentrun.worker.core.agents import Agent
from agentrun.worker.core.records import RunStatus
from agentrun.worker.store import RunStore, migrate
from agentrun.worker.store.pool import open_pool
from agentrun.worker.testing.scripted import ScriptedLlm
from agentrun.worker.tools import ToolContext, tool
from tests.support.builders import http_app, new_run, worker
from tests.support.roles import run_section, sections


async def test_a_worker_runs_as_the_least_privileged_role(postgres_url: str, roles: dict[str, str]) -> None:
    parts = sections(roles)
    assert set(parts) == {"cluster", "database", "after migrate", "retention"}
    run_section(postgres_url, parts["cluster"])
    # As the file says: set the passwords. A server that asks for them (testcontainers' postgres image,
    # a managed one behind AGENTRUN_TEST_DATABASE_URL) then lets the roles in; one that trusts local
    # connections (the embedded server) ignores them. Host, port and options stay the admin URL's.
    passwords = {role: f"pw-{uuid.uuid4().hex}" for role in (roles["agentrun_owner"], roles["agentrun_runtime"])}
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        for role, password in passwords.items():
            admin.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(role), sql.Literal(password)))
    db_url = make_conninfo(postgres_url, dbname=roles["agentrun"])
    run_section(db_url, parts["database"])
    owner_url = make_conninfo(db_url, user=roles["agentrun_owner"], password=passwords[roles["agentrun_owner"]])
    runtime_url = make_conninfo(db_url, user=roles["agentrun_runtime"], password=passwords[roles["agentrun_runtime"]])
    await migrate.migrate(owner_url)
    run_section(owner_url, parts["after migrate"])

    # A worker that migrates at start finds nothing to do and needs no DDL for that.
    assert await migrate.migrate(runtime_url) == []
    pool = await open_pool(runtime_url, max_size=4)
    try:
        store = RunStore(pool)

        @tool(name="lookup")
        async def lookup(args: dict[str, Any], ctx: ToolContext) -> str:
            return "found"

        llm = ScriptedLlm().then_tool_use("t1", "lookup", {}, 10, 5).then_text("done", 10, 5)
        run, _ = await store.create(new_run())
        assert await worker(store, llm, [lookup]).run_once() == run.id
        after = await store.get(run.id)
        assert after is not None and after.status is RunStatus.SUCCEEDED
        second, _ = await store.create(new_run())
        assert (await store.cancel(second.id)).status is RunStatus.CANCELLED  # type: ignore[union-attr]
        # Completion webhooks (migration 0019): the status change's trigger writes the delivery as this role,
        # a sender claims it and records its attempt, the API reads both.
        hook = {"url": "https://hooks.example.com/agentrun", "events": ["finished"], "secretRef": "hooks"}
        hooked, _ = await store.create(new_run(webhook=hook))
        assert (await store.cancel(hooked.id)).status is RunStatus.CANCELLED  # type: ignore[union-attr]
        [delivery] = await store.claim_webhooks("worker-A", 30.0, 10)
        assert await store.record_webhook_attempt(
            delivery, "worker-A", datetime.datetime.now(datetime.UTC), status_code=204, latency_ms=3, error=None,
            delivered=True, retry_in=5.0, give_up_seconds=86400.0,
        ) == "DELIVERED"
        [seen] = await store.webhooks_of(hooked.id)
        assert seen.state == "DELIVERED" and len(seen.history) == 1
        # Agent definitions: stored, versioned, read and deleted by the API and the operator (migration 0014).
        assert (await store.put_agent(Agent(name="researcher", version=0)))[0].version == 1
        assert (await store.put_agent(Agent(name="researcher", version=0, system="v2")))[0].version == 2
        assert await store.delete_agent("researcher") and await store.agents() == []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=http_app(store)), base_url="http://w") as c:
            assert (await c.get("/readyz")).status_code == 200
    finally:
        await pool.close()

    with psycopg.connect(runtime_url, autocommit=True) as conn:
        for forbidden in ("CREATE TABLE sneaky (x int)", "DELETE FROM run_step", "TRUNCATE run_lease",
                          "DROP TABLE run_step", "ALTER TABLE run ADD COLUMN x int", "SELECT * FROM run_lease"):
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(forbidden.encode())
        row = conn.execute("SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = current_user").fetchone()
        assert row == (False, False, False)
