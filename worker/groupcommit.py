"""Group commit: the fenced writes of many in-flight runs sent together, in one round trip and one commit.

Each write keeps its own statement, and with it its own fence: a run whose lease is gone gets no row
back and only its writer hears `LeaseLost`; the others in the batch are written. A write is only
answered once its batch has committed, so a step is durable before the engine acts on it.

Batching never waits for company. A write that finds a sender free is sent at once, alone; the writes
that arrive while every sender is busy gather in the queue and go together as soon as one is free. So a
lone step pays no latency, and many runs in flight share round trips, commits and WAL flushes.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

log = logging.getLogger(__name__)

Row = dict[str, Any]


def transient(e: BaseException) -> bool:
    """An error after which the same statement may succeed: the connection broke (the outcome of a write
    sent on it is unknown), the server is shutting down or read-only for a failover, or it refused for
    lack of resources. A constraint or data error is not: retrying it gives the same answer."""
    if isinstance(e, psycopg.OperationalError):  # includes a pool that could hand out no connection in time
        return True
    state = getattr(e, "sqlstate", None) or ""
    return isinstance(e, psycopg.Error) and (
        state.startswith(("08", "53", "57P", "40")) or state == "25006"  # 25006: read-only transaction
    )


@dataclasses.dataclass(eq=False)
class _Write:
    run_id: uuid.UUID
    query: bytes
    params: Mapping[str, Any] | Sequence[Any]
    answer: asyncio.Future[Row | None]


@dataclasses.dataclass
class BatchStats:
    """What the batcher did, for the benchmarks and the metrics."""

    writes: int = 0
    batches: int = 0
    largest: int = 0
    split: int = 0
    """Batches a refused write made to be sent again one write at a time."""


class GroupCommit:
    """Sends fenced single-row writes, batched while they queue.

    `senders` batches may be in flight at once, each on a pooled connection of its own; a batch holds
    at most `max_batch` writes. Within a batch the writes go in run id order, and every other statement
    that locks several runs (`RunStore.renew`) locks them in that order too, so two transactions never
    wait on each other in a circle.
    """

    def __init__(self, pool: AsyncConnectionPool[Any], *, senders: int = 2, max_batch: int = 128) -> None:
        if senders < 1 or max_batch < 1:
            raise ValueError("group commit: senders and max_batch must be at least 1")
        self.pool = pool
        self.senders = senders
        self.max_batch = max_batch
        self.stats = BatchStats()
        self._queue: collections.deque[_Write] = collections.deque()
        self._sending = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def write(self, run_id: uuid.UUID, query: bytes, params: Mapping[str, Any] | Sequence[Any]) -> Row | None:
        """Send one statement that changes the run `run_id`; its first row (None for none) once committed.

        Raises what the database raised for this statement. An error that leaves the outcome unknown (a
        connection lost with the batch in flight) is raised to every writer in the batch: each of them
        sends its write again, and its write id makes the copy find the first (store.py).
        """
        answer: asyncio.Future[Row | None] = asyncio.get_running_loop().create_future()
        self._queue.append(_Write(run_id, query, params, answer))
        if self._sending < self.senders:
            self._sending += 1
            task = asyncio.create_task(self._send_while_queued(), name="agentrun-group-commit")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        # A writer that stops waiting (its run given up) leaves its write to be sent or skipped: it has
        # no say over a statement that may already be on the wire, as with a write of its own.
        return await answer

    async def _send_while_queued(self) -> None:
        try:
            while self._queue:
                batch: list[_Write] = []
                while self._queue and len(batch) < self.max_batch:
                    w = self._queue.popleft()
                    if not w.answer.done():  # a writer cancelled before its write left: not sent at all
                        batch.append(w)
                if batch:
                    await self._send(batch)
        finally:
            self._sending -= 1

    async def _send(self, batch: list[_Write]) -> None:
        self.stats.writes += len(batch)
        self.stats.batches += 1
        self.stats.largest = max(self.stats.largest, len(batch))
        try:
            if len(batch) == 1:
                rows = [await self._alone(batch[0])]
            else:
                rows = await self._together(batch)
        except psycopg.Error as e:
            if len(batch) > 1 and not transient(e):
                # One write was refused (a constraint, a value the database cannot take): the batch was
                # rolled back whole, so each is sent again on its own and only that one fails.
                self.stats.split += 1
                log.debug("a batch of %d writes was refused (%s); sending them one by one", len(batch), e)
                for w in batch:
                    await self._send([w])
                return
            _answer_all(batch, e)
            return
        except BaseException as e:
            _answer_all(batch, e if isinstance(e, Exception) else psycopg.OperationalError(f"batch not sent: {e!r}"))
            raise
        for w, row in zip(batch, rows, strict=True):
            if not w.answer.done():
                w.answer.set_result(row)

    async def _alone(self, w: _Write) -> Row | None:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(w.query, w.params)
            row: Row | None = await cur.fetchone()
            return row

    async def _together(self, batch: list[_Write]) -> list[Row | None]:
        """One transaction, pipelined: BEGIN, the statements and COMMIT leave in one round trip."""
        batch.sort(key=lambda w: w.run_id)
        async with self.pool.connection() as conn:
            cursors = []
            async with conn.pipeline(), conn.transaction():
                for w in batch:
                    cur = conn.cursor(row_factory=dict_row)
                    await cur.execute(w.query, w.params)
                    cursors.append(cur)
            return [await cur.fetchone() for cur in cursors]

    async def aclose(self) -> None:
        """Wait for the batches in flight (their writers are waiting for them)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _answer_all(batch: list[_Write], error: Exception) -> None:
    for w in batch:
        if not w.answer.done():
            w.answer.set_exception(error)
