"""The database fixtures' bodies, shared by tests/conftest.py (a loop per test) and tests/ui/conftest.py
(the browser tests' session loop), which declare them with their own loop scope."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from agentrun.worker.store.pool import open_pool


async def pool(database_url: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    p = await open_pool(database_url, max_size=20)
    try:
        yield p
    finally:
        await p.close()


async def db(database_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A plain connection for a test to look at (or tamper with) the tables directly."""
    conn = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    try:
        yield conn
    finally:
        await conn.close()
