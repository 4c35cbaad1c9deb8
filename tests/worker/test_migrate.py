"""Migrations: a fresh database migrates cleanly, twice, and concurrently."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from agentrun.worker.store import migrate


async def _fresh(postgres_url: str) -> str:
    name = f"agentrun_fresh_{uuid.uuid4().hex[:10]}"
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return make_conninfo(postgres_url, dbname=name)


async def _tables(url: str) -> set[str]:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {r[0] for r in await cur.fetchall()}


async def test_fresh_database_migrates_cleanly_twice(postgres_url: str) -> None:
    url = await _fresh(postgres_url)
    first = await migrate.migrate(url)
    assert [m.version for m in first] == [m.version for m in migrate.available()]
    assert await migrate.migrate(url) == []
    assert {"run", "run_step", "schema_migration"} <= await _tables(url)
    async with await psycopg.AsyncConnection.connect(url) as conn:
        assert await migrate.current_version(conn) == migrate.latest_version()


async def test_concurrent_migrations_do_not_race(postgres_url: str) -> None:
    url = await _fresh(postgres_url)
    results: list[Any] = await asyncio.gather(*(migrate.migrate(url) for _ in range(4)))
    assert sorted(len(r) for r in results) == [0, 0, 0, len(migrate.available())]


async def test_unmigrated_database_has_no_version(postgres_url: str) -> None:
    url = await _fresh(postgres_url)
    async with await psycopg.AsyncConnection.connect(url) as conn:
        assert await migrate.current_version(conn) is None
