"""The worker's own database session: it holds the worker's liveness lock for as long as the process
lives, and listens for the notifications that wake an idle worker when a run becomes claimable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import psycopg

from agentrun.worker.store import LIVENESS_LOCK_CLASS, RunStore

log = logging.getLogger("agentrun.worker.presence")

# The channel migration 0002 notifies when a run is queued or a lease is given back.
WAKE_CHANNEL = "agentrun_wake"



class DuplicateWorker(RuntimeError):
    """Another live session holds this worker id's liveness lock: two workers share one --id."""


class Presence:
    """One dedicated connection per worker process.

    With `liveness_lock`, it holds a session-level advisory lock keyed by the worker id: when the process
    dies, PostgreSQL ends the session and drops the lock, and other workers may claim its RUNNING runs at
    once instead of waiting out the lease. It also LISTENs on the wake-up channel and sets `wake` on every
    notification; when the connection drops it reconnects with backoff while polling carries on.
    """

    def __init__(self, store: RunStore, worker_id: str, wake: asyncio.Event, *, liveness_lock: bool = True) -> None:
        self.store = store
        self.worker_id = worker_id
        self.wake = wake
        self.liveness_lock = liveness_lock
        self.ready = asyncio.Event()  # set while the lock is held (if asked for) and the LISTEN is on
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, timeout: float = 10.0) -> None:
        """Connect, take the lock and listen; raises DuplicateWorker if the lock stays taken."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                self._conn = await self._connect()
                break
            except DuplicateWorker:
                # The previous session of a restarted worker with the same id may take a moment to end.
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.2)
        self._task = asyncio.create_task(self._listen(), name=f"{self.worker_id}-presence")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._disconnect()

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        conn = await self.store.dedicated_connection()
        try:
            if self.liveness_lock:
                cur = await conn.execute(
                    "SELECT pg_try_advisory_lock(%s, hashtext(%s))", (LIVENESS_LOCK_CLASS, self.worker_id)
                )
                row = await cur.fetchone()
                if not row or not row[0]:
                    raise DuplicateWorker(
                        f"worker id {self.worker_id!r} is in use by another live worker; give each worker a "
                        "unique --id (the default, host-pid, is)"
                    )
            await conn.execute(f"LISTEN {WAKE_CHANNEL}")
        except BaseException:
            await conn.close()
            raise
        self.ready.set()
        return conn

    async def _disconnect(self) -> None:
        self.ready.clear()
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
            self._conn = None

    async def _listen(self) -> None:
        backoff = 0.1
        while True:
            try:
                if self._conn is None:
                    self._conn = await self._connect()
                    backoff = 0.1
                    self.wake.set()  # anything queued while we were deaf
                async for _ in self._conn.notifies():
                    self.wake.set()
            except (psycopg.Error, DuplicateWorker) as e:
                log.warning("%s lost its presence connection (%s); reconnecting in %.1fs", self.worker_id, e, backoff)
                await self._disconnect()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
