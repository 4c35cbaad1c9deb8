"""The connection pool every part of the worker shares."""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool


async def open_pool(
    conninfo: str, max_size: int = 10, min_size: int = 1, timeout: float = 30.0
) -> AsyncConnectionPool[Any]:
    """Autocommit connections: every write of the store is a single statement, atomic by itself."""
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        conninfo,
        min_size=min_size,
        max_size=max_size,
        open=False,
        kwargs={"autocommit": True},
        timeout=timeout,
        name="agentrun",
    )
    await pool.open(wait=True, timeout=timeout)
    return pool
