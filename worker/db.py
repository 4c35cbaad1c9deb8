"""The connection pool every part of the worker shares."""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool


async def open_pool(
    conninfo: str, max_size: int = 10, min_size: int = 1, timeout: float = 30.0
) -> AsyncConnectionPool[Any]:
    """Autocommit connections: every write of the store is a single statement, atomic by itself.

    Each connection is checked as it leaves the pool (`check`): after a restart, a failover or an idle
    timeout the pool discards the dead ones and hands out a live one, instead of an error per checkout.
    """
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        conninfo,
        min_size=min_size,
        max_size=max_size,
        open=False,
        kwargs={"autocommit": True},
        timeout=timeout,
        check=AsyncConnectionPool.check_connection,
        name="agentrun",
    )
    await pool.open(wait=True, timeout=timeout)
    return pool
