"""What every part of `RunStore` stands on: the pool, the group commit of fenced writes, one-query helpers."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from agentrun.worker.core.records import (
    Run,
)
from agentrun.worker.store.groupcommit import GroupCommit, Shared
from agentrun.worker.store.rows import (
    RUN_COLUMNS,
    as_run,
)


class Gateway:
    """`writes` sends the fenced writes of held runs; by default they are group-committed (groupcommit.py)."""

    def __init__(
        self, pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]], writes: GroupCommit | None = None
    ) -> None:
        self.pool = pool
        self.writes = writes or GroupCommit(pool)
        # New runs are group-committed too (store/submit.py), by a batcher of their own: a burst of
        # submissions and the steps of held runs do not wait in each other's queue, and each has its figures.
        self.inserts = GroupCommit(pool, max_batch=self.writes.max_batch, writers_return=False)
        # The batched submissions of an Idempotency-Key on their way now, by tenant and key (store/submit.py):
        # a copy of one that arrives meanwhile waits for its answer instead of being written, then read.
        self.submitting: dict[tuple[str, str], asyncio.Future[Run | None]] = {}

    async def dedicated_connection(self) -> psycopg.AsyncConnection[Any]:
        """A connection of its own, with the pool's settings, for a session that outlives any one query."""
        conninfo_source, kwargs_source = self.pool.conninfo, self.pool.kwargs
        conninfo = conninfo_source() if callable(conninfo_source) else conninfo_source
        if not isinstance(conninfo, str):
            conninfo = await conninfo
        kwargs = kwargs_source() if callable(kwargs_source) else kwargs_source
        if kwargs is not None and not isinstance(kwargs, dict):
            kwargs = await kwargs
        return await psycopg.AsyncConnection.connect(conninfo, **{**(kwargs or {}), "autocommit": True})

    async def _one(self, query: str, params: dict[str, Any] | Sequence[Any]) -> dict[str, Any] | None:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(query.encode(), params)
            return await cur.fetchone()

    async def _fenced(
        self, run_id: uuid.UUID, query: str, params: dict[str, Any], shared: Shared | None = None, *,
        again: bool = False,
    ) -> dict[str, Any] | None:
        """A write to a held run, sent with the other in-flight runs' writes (group commit); with the
        statement its kind shares with them, when it has one (`params` holds the values it takes).

        `again`: the write is a copy sent after the outcome of the first was lost. The first may still
        be executing on the server, waiting for the run row; the copy locks the row in a statement of
        its own first (groupcommit.py), so the write's statement, whose snapshot is taken after that,
        sees the first copy if it committed and finds it by its write id.
        """
        values = tuple(params[name] for name in shared.columns) if shared is not None else None
        return await self.writes.write(
            run_id, query.encode(), params, (shared, values) if shared is not None and values is not None else None,
            resend=again,
        )

    async def _all(self, query: str, params: dict[str, Any] | Sequence[Any]) -> list[dict[str, Any]]:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(query.encode(), params)
            return await cur.fetchall()

    async def _all_sent(
        self, query: str, params: dict[str, Any] | Sequence[Any]
    ) -> tuple[list[dict[str, Any]], float]:
        """`_all`, and when the statement was sent (time.monotonic()), once a connection was had: a wait
        for one (the pool reconnecting after an outage, say) is not counted in it."""
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            sent_at = time.monotonic()
            await cur.execute(query.encode(), params)
            return await cur.fetchall(), sent_at

    async def get(self, run_id: uuid.UUID) -> Run | None:
        row = await self._one(f"SELECT {RUN_COLUMNS} FROM run r WHERE r.id = %s", (run_id,))
        return as_run(row) if row else None
