"""Group commit: the fenced writes of many in-flight runs sent together, in one round trip and one commit.

Each write keeps its own statement, and with it its own fence: a run whose lease is gone gets no row
back and only its writer hears `LeaseLost`; the others in the batch are written. A write is only
answered once its batch has committed, so a step is durable before the engine acts on it.

Batching waits for no stranger. A write that finds a sender free is sent at once, alone; the writes
that arrive while every sender is busy gather in the queue and go together as soon as one is free. So a
lone step pays no latency, and many runs in flight share round trips, commits and WAL flushes. The one wait:
a batch of fewer than RETURN_BATCH writes waits up to RETURN_WAIT for the runs whose step writes its sender
has just answered, as they are about to write again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
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
    lack of resources, or the statement was given up on: a statement or lock timeout (57014, 55P03), a
    serialization failure or a deadlock (40001, 40P01), all rolled back whole. A constraint or data error
    is not: retrying it gives the same answer."""
    if isinstance(e, psycopg.OperationalError):  # includes a pool that could hand out no connection in time
        return True
    state = getattr(e, "sqlstate", None) or ""
    return isinstance(e, psycopg.Error) and (
        state.startswith(("08", "53", "57P", "40")) or state in ("25006", "57014", "55P03")  # 25006: read-only
    )


@dataclasses.dataclass(frozen=True)
class Shared:
    """A kind of write whose copies for many runs can go as ONE statement: `query` takes each of
    `columns` as an array (one element per run, `id` first) and returns one row per run still held,
    with its `id`. The statement must fence every run in it on its own, and lock them in id order."""

    kind: str
    query: bytes
    columns: tuple[str, ...]

    def params(self, rows: Sequence[tuple[Any, ...]]) -> dict[str, list[Any]]:
        return {name: [row[i] for row in rows] for i, name in enumerate(self.columns)}


@dataclasses.dataclass(eq=False)
class _Write:
    run_id: uuid.UUID
    query: bytes
    params: Mapping[str, Any] | Sequence[Any]
    answer: asyncio.Future[Row | None]
    shared: tuple[Shared, tuple[Any, ...]] | None = None
    """The write's values for its kind's shared statement, if it has one (`values[0]` is the run id)."""
    resend: bool = False
    """A copy of a write whose outcome was lost: its run row is locked first (LOCK_FIRST)."""


# A copy of a write sent again may overlap its first copy, still executing on the server and waiting
# for the run row. Under READ COMMITTED a statement reads from the snapshot it took when it began, so
# the copy's own statement could not see the first copy commit while it waited for the same row, and
# would write the step a second time (or count an attempt twice). Locking the row in a statement of
# its own first, in the same transaction, makes the write's statement take its snapshot after the
# first copy has committed: it finds it by its write id. Only copies pay for it.
LOCK_FIRST = b"SELECT id FROM run WHERE id = ANY(%s) ORDER BY id FOR UPDATE"


_LINGER_TURNS = 3

RETURN_WAIT = 0.001
"""Seconds a batch waits, at most, for the writers its sender answered last to write again. A run whose step
takes no time (a checkpoint, then its tool's end) is back within a fraction of a millisecond, but its turn on
the event loop comes after the other runs': sent at once, a batch left without them, and at B1's concurrency 8
the runs split into two or three batches in flight, each paying its statement and commit (4 writes a batch).
Waiting for them makes one batch of all 8: half the database's time and a third of the worker's a step. A run
that does not come back (a model call, a slow tool, its end) costs each batch at most this much."""

RETURN_BATCH = 8
"""A batch this large goes at once: beyond it a statement's and a commit's cost are shared well enough, and
waiting would only keep the other sender idle (at concurrency 32, two batches of 16 in flight beat one of 32)."""


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
    at most `max_batch` writes. `max_batch=1` turns batching off: each write is sent at once, alone,
    on a connection of its own (bench/ceiling.py measures that store).
    """

    def __init__(
        self, pool: AsyncConnectionPool[Any], *, senders: int = 2, max_batch: int = 512, writers_return: bool = True,
    ) -> None:
        """`writers_return`: a writer answered writes again at once, as a held run's steps do (RETURN_WAIT); not so
        a submission, whose writer is done."""
        if senders < 1 or max_batch < 1:
            raise ValueError("group commit: senders and max_batch must be at least 1")
        self.pool = pool
        self.senders = senders
        self.max_batch = max_batch
        self.writers_return = writers_return
        self.stats = BatchStats()
        self._queue: collections.deque[_Write] = collections.deque()
        self._returning: set[uuid.UUID] = set()  # runs whose writes were just answered, expected to write again
        self._arrived = asyncio.Event()  # set by each write queued
        self._sending = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def write(
        self, run_id: uuid.UUID, query: bytes, params: Mapping[str, Any] | Sequence[Any],
        shared: tuple[Shared, tuple[Any, ...]] | None = None, *, resend: bool = False,
    ) -> Row | None:
        """Send one statement that changes the run `run_id`; its first row (None for none) once committed.

        With `shared` (the kind's statement and this write's values for it), the write goes with the
        other queued writes of its kind in one statement; alone, or sent again alone, it is `query`.

        Raises what the database raised for this statement. An error that leaves the outcome unknown (a
        connection lost with the batch in flight) is raised to every writer in the batch: each of them
        sends its write again (`resend`), and its write id makes the copy find the first (store.py).
        """
        if self.max_batch == 1:  # no batching at all: each write its own statement, on its own checkout
            async with self.pool.connection() as conn:
                return await _alone(conn, query, params, run_id if resend else None)
        answer: asyncio.Future[Row | None] = asyncio.get_running_loop().create_future()
        self._queue.append(_Write(run_id, query, params, answer, shared, resend))
        self._returning.discard(run_id)
        self._arrived.set()
        if self._sending < self.senders:
            self._start_sender()
        # A writer that stops waiting (its run given up) leaves its write to be sent or skipped: it has
        # no say over a statement that may already be on the wire, as with a write of its own.
        return await answer

    def _start_sender(self) -> None:
        self._sending += 1
        task = asyncio.create_task(self._send_while_queued(), name="agentrun-group-commit")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_while_queued(self) -> None:
        """Send batches while writes are queued, on one connection taken once for the whole burst: a
        checkout (and the pool's check of the connection, a round trip) per burst, not per batch."""
        try:
            while self._queue:
                try:
                    async with self.pool.connection() as conn:
                        while batch := await self._next_batch():
                            if not await self._send(conn, batch):
                                break  # the connection broke: give it back, take another
                except Exception as e:  # no connection to be had: the writers retry (transient) or fail
                    _answer_all(self._drain(), e)
        finally:
            self._sending -= 1

    async def _next_batch(self) -> list[_Write]:
        """The next writes to send; none once the queue has stayed empty for a few turns of the event
        loop. The writers just answered write again after a step that takes no time (a checkpoint,
        then the tool's start), and waiting those turns keeps the connection for them: no checkout,
        and no check of the connection, per batch."""
        for _ in range(_LINGER_TURNS):
            if self._queue:
                break
            await asyncio.sleep(0)
        if self._queue and self._returning and len(self._queue) < RETURN_BATCH:
            await self._wait_for_returning()
        batch: list[_Write] = []
        while self._queue and len(batch) < self.max_batch:
            w = self._queue.popleft()
            if not w.answer.done():  # a writer cancelled before its write left: not sent at all
                batch.append(w)
        return batch

    async def _wait_for_returning(self) -> None:
        """Until the writers answered last have written again, or RETURN_BATCH writes are queued, or
        RETURN_WAIT has passed."""
        deadline = asyncio.get_running_loop().time() + RETURN_WAIT
        while self._returning and len(self._queue) < RETURN_BATCH:
            self._arrived.clear()
            try:
                async with asyncio.timeout_at(deadline):
                    await self._arrived.wait()
            except TimeoutError:
                break
        self._returning.clear()  # those not back by now are not waited for again

    def _drain(self) -> list[_Write]:
        batch, self._queue = list(self._queue), collections.deque()
        return batch

    async def _send(self, conn: psycopg.AsyncConnection[Any], batch: list[_Write]) -> bool:
        """Send a batch and answer its writers; False if the connection broke (it must not be reused)."""
        self.stats.writes += len(batch)
        self.stats.batches += 1
        self.stats.largest = max(self.stats.largest, len(batch))
        try:
            if len(batch) == 1:
                answers = [(batch[0], await _alone(conn, batch[0].query, batch[0].params, _lock(batch[0])))]
            else:
                answers = await commit_together(conn, batch)
        except psycopg.Error as e:
            if transient(e) or len(batch) == 1:
                _answer_all(batch, e)
                return not transient(e) and not conn.closed
            # One write was refused (a constraint, a value the database cannot take): the batch was
            # rolled back whole, so each is sent again on its own and only that one fails.
            self.stats.split += 1
            log.debug("a batch of %d writes was refused (%s); sending them one by one", len(batch), e)
            for w in batch:
                try:
                    answers = [(w, await _alone(conn, w.query, w.params, _lock(w)))]
                except psycopg.Error as alone:
                    _answer_all([w], alone)
                    if transient(alone):
                        _answer_all(batch, alone)
                        return False
                    continue
                _answer(answers)
            return True
        except BaseException as e:
            _answer_all(batch, e if isinstance(e, Exception) else psycopg.OperationalError(f"batch not sent: {e!r}"))
            raise
        _answer(answers)
        if self.writers_return:  # a step's write (a shared kind): its run's next step writes soon; not its end
            self._returning.update(w.run_id for w in batch if w.shared is not None)
        return True

    async def aclose(self) -> None:
        """Wait for the batches in flight (their writers are waiting for them)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _lock(w: _Write) -> uuid.UUID | None:
    return w.run_id if w.resend else None


async def _alone(
    conn: psycopg.AsyncConnection[Any], query: bytes, params: Mapping[str, Any] | Sequence[Any],
    lock: uuid.UUID | None = None,
) -> Row | None:
    """One statement; with `lock` (a copy sent again), in a transaction that locks that run first."""
    cur = conn.cursor(row_factory=dict_row)
    if lock is None:
        await cur.execute(query, params)
        row: Row | None = await cur.fetchone()
        return row
    async with conn.transaction():
        await cur.execute(LOCK_FIRST, ([lock],))
        await cur.execute(query, params)
        row = await cur.fetchone()
    return row


async def commit_together(conn: psycopg.AsyncConnection[Any], batch: list[_Write]) -> list[tuple[_Write, Row | None]]:
    """One transaction, pipelined: BEGIN, the statements and COMMIT leave in one round trip.

    The writes of a kind that has a shared statement go as one statement; the rest one each. No lock
    is waited for in a circle: the writes of a batch are to runs no other batch writes (a run has one
    write in flight at a time), and the one other statement that locks many held runs, the renewal,
    skips those that are locked (`RunStore.renew`). The one exception, a copy sent again while its
    first copy still runs in an earlier batch on a broken connection, locks its batch's runs in id
    order first; should it still meet a deadlock, the database breaks it (40P01) and the writers send
    their writes again (transient).
    """
    kinds: dict[str, list[_Write]] = {}
    single: list[_Write] = []
    for w in batch:
        if w.shared is None:
            single.append(w)
        else:
            kinds.setdefault(w.shared[0].kind, []).append(w)
    for kind, writes in list(kinds.items()):
        if len(writes) == 1 or len({w.run_id for w in writes}) < len(writes):
            single.extend(kinds.pop(kind))  # alone, or (never in practice) a run twice: one each
    shared_cursors, single_cursors = [], []
    # With a copy among them, every run of the batch is locked first, in id order as the shared
    # statements lock theirs: the statements after it see what committed while they waited (LOCK_FIRST).
    lock_first = any(w.resend for w in batch)
    statements = len(kinds) + len(single) + lock_first
    async with conn.pipeline(), (conn.transaction() if statements > 1 else contextlib.nullcontext()):
        if lock_first:
            await conn.cursor().execute(LOCK_FIRST, (sorted({w.run_id for w in batch}),))
        for writes in kinds.values():
            form = writes[0].shared[0]  # type: ignore[index]
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(form.query, form.params([w.shared[1] for w in writes]))  # type: ignore[index]
            shared_cursors.append((cur, writes))
        for w in single:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(w.query, w.params)
            single_cursors.append((cur, w))
    answers: list[tuple[_Write, Row | None]] = []
    for cur, writes in shared_cursors:
        rows = {row["id"]: row for row in await cur.fetchall()}
        answers.extend((w, rows.get(w.run_id)) for w in writes)
    for cur, w in single_cursors:
        answers.append((w, await cur.fetchone()))
    return answers


def _answer(answers: list[tuple[_Write, Row | None]]) -> None:
    for w, row in answers:
        if not w.answer.done():
            w.answer.set_result(row)


def _answer_all(batch: list[_Write], error: BaseException) -> None:
    for w in batch:
        if not w.answer.done():
            w.answer.set_exception(error)
