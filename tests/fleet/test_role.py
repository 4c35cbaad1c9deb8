"""The least-privileged runtime role (docs/database-role.sql) can use the model limits, and prunes only
once the file's optional [retention] section has been applied."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import errors, sql
from psycopg.conninfo import make_conninfo

from agentrun.worker.llm.limits import Limiter, ModelLimits
from agentrun.worker.store import migrate, retention
from agentrun.worker.store.pool import open_pool
from tests.support.roles import run_section, sections


async def test_runtime_role_limits_and_retention(postgres_url: str, roles: dict[str, str]) -> None:
    parts = sections(roles)
    run_section(postgres_url, parts["cluster"])
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

    pool = await open_pool(runtime_url, max_size=2)
    try:
        limiter = Limiter(ModelLimits.parse({"m": {"maxConcurrentRequests": 1, "tokensPerMinute": 1000}}), pool)
        grant = await limiter.acquire("m", 10)
        assert grant is not None
        await limiter.release(grant, 5)
        await limiter.tighten(grant, 0.0)
    finally:
        await pool.close()

    async def prune() -> Any:
        async with await psycopg.AsyncConnection.connect(runtime_url, autocommit=True) as conn:
            return await retention.prune(conn, datetime.timedelta(days=30))

    with pytest.raises(errors.InsufficientPrivilege):
        await prune()
    run_section(owner_url, parts["retention"])
    assert (await prune()).runs == 0
