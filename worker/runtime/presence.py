"""The worker's own database session: it holds the worker's liveness lock for as long as the process
lives, and listens for the notifications that wake an idle worker (a run became claimable) or interrupt
a held run (someone asked it to stop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from agentrun.worker.runtime.errors import DuplicateWorker as DuplicateWorker
from agentrun.worker.store import RunStore, channels, claims
from agentrun.worker.store.channels import CANCEL_CHANNEL, WAKE_CHANNEL

log = logging.getLogger("agentrun.worker.runtime.presence")

PROBE_INTERVAL = 1.0
"""Seconds between checks that the session is still there. A dropped session frees the liveness lock,
and others may take this worker's runs once it has stayed free for the liveness grace (a second or
more): finding out within a second leaves time to take the lock back first."""

PROBE_TIMEOUT = 2.0
"""How long a check may take before the connection counts as dead (a socket that went silent)."""

VOUCH_TIMEOUT = 0.5
"""How long one vouch through the pool may take while the session is down (others are sent meanwhile)."""

VOUCHES_IN_FLIGHT = 4
"""Vouches waiting at once at most: one stuck on a stalled connection must not stop the next, and a pool
that cannot answer at all must not fill up with them."""


def vouch_interval(grace: float) -> float:
    """Seconds between two vouches while the session is down: four within the liveness grace, so that a
    suspicion of this worker never grows old enough for a takeover while its pool reaches the database,
    however long one connect attempt takes."""
    return max(grace / 4, 0.05)

CONNECT_TIMEOUT = 5.0
"""How long one connection attempt may take (an unreachable host would otherwise hang it)."""


def reconnect_delay(rng: random.Random) -> float:
    """Sub-second and jittered: a blip of every connection must not become a takeover, and a fleet
    reconnecting after a restart must not arrive all at once."""
    return rng.uniform(0.02, 0.2)


class Presence:
    """One dedicated connection per worker process.

    With `liveness_lock`, it holds a session-level advisory lock keyed by the worker id: when the process
    dies, PostgreSQL ends the session and drops the lock, and other workers may claim its RUNNING runs
    soon after instead of waiting out the lease (store.claim, store.suspect). When the connection drops
    while the process lives, it withdraws any suspicion of it through the pool every quarter of the
    grace (store.vouch) for as long as it is down, reconnects, and takes the lock back, so a live worker
    keeps its runs however long its reconnect takes. It also LISTENs: `wake` is set on every wake-up
    notification, and `on_cancel(run_id)` is called for every cancel notification.
    """

    def __init__(
        self,
        store: RunStore,
        worker_id: str,
        wake: asyncio.Event,
        *,
        liveness_lock: bool = True,
        on_cancel: Callable[[uuid.UUID], None] | None = None,
        grace: float = 1.0,
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.wake = wake
        self.liveness_lock = liveness_lock
        self.on_cancel = on_cancel
        self.grace = grace
        """The liveness grace others give this worker (settings.takeover_grace): it paces the vouches."""
        self.ready = asyncio.Event()  # set while the lock is held (if asked for) and the LISTEN is on
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self._rng = random.Random()
        self._duplicate: DuplicateWorker | None = None
        self._attempted = asyncio.Event()  # set once a connection attempt has come to an end, either way
        self._vouching: asyncio.Task[None] | None = None
        self._vouches: set[asyncio.Task[None]] = set()  # vouches in flight
        self._probing_since: float | None = None  # when the probe now waiting for its answer was sent

    async def start(self, timeout: float = 10.0) -> None:
        """Start the session in the background and wait up to `timeout` for it.

        Raises DuplicateWorker if the lock stays taken by another session all that time. A database
        that cannot be reached is not an error: the session keeps trying, and `ready` tells when it is on.
        """
        self._task = asyncio.create_task(self._serve(), name=f"{self.worker_id}-presence")
        if self.liveness_lock:
            self._vouching = asyncio.create_task(self._vouch_while_down(), name=f"{self.worker_id}-vouch")
        ready = asyncio.ensure_future(self.ready.wait())
        try:
            await asyncio.wait({ready, self._task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if not self.ready.is_set() and not self._attempted.is_set():
                # On a slow machine the first attempt may outlast `timeout`: its answer decides.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._attempted.wait(), CONNECT_TIMEOUT)
        finally:
            ready.cancel()
        if self._task.done():
            self._task.result()  # a bug in _serve: let it show
        if not self.ready.is_set() and self._duplicate is not None:
            error = self._duplicate
            await self.close()
            raise error

    async def close(self) -> None:
        for task in [self._task, self._vouching, *self._vouches]:
            if task is not None:
                task.cancel()
        for task in [self._task, self._vouching]:
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._vouching = None
        # A vouch stuck in a cancel that psycopg waits out is not waited for: it changes nothing.
        await self._disconnect()

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        conn = await self.store.dedicated_connection()
        try:
            if self.liveness_lock:
                if not await claims.take_liveness_lock(conn, self.worker_id):
                    raise DuplicateWorker(
                        f"worker id {self.worker_id!r} is in use by another live worker; give each worker a "
                        "unique --id (the default, or --id-prefix, is)"
                    )
                await claims.clear_suspicion(conn, self.worker_id)
            await channels.listen(conn, WAKE_CHANNEL, CANCEL_CHANNEL)
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

    def _dispatch(self, notify: psycopg.Notify) -> None:
        if notify.channel == CANCEL_CHANNEL:
            with contextlib.suppress(ValueError):
                run_id = uuid.UUID(notify.payload)
                if self.on_cancel is not None:
                    self.on_cancel(run_id)
            return
        self.wake.set()

    async def _serve(self) -> None:
        """Connect, listen and probe; on any failure reconnect within a fraction of a second."""
        down_since: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            try:
                if self._conn is None:
                    try:
                        async with asyncio.timeout(CONNECT_TIMEOUT):
                            self._conn = await self._connect()
                    finally:
                        self._attempted.set()
                    self._duplicate = None
                    if down_since is not None:
                        log.info(
                            "%s presence connection is back after %.1fs", self.worker_id, loop.time() - down_since
                        )
                    down_since = None
                    self.wake.set()  # anything queued while we were deaf
                async for notify in self._conn.notifies(timeout=PROBE_INTERVAL):
                    self._dispatch(notify)
                self._probing_since = loop.time()
                try:
                    async with asyncio.timeout(PROBE_TIMEOUT):
                        await channels.ping(self._conn)
                finally:
                    self._probing_since = None
            except (psycopg.Error, DuplicateWorker, TimeoutError, OSError) as e:
                if isinstance(e, DuplicateWorker):
                    self._duplicate = e
                if down_since is None:
                    down_since = loop.time()
                    log.warning("%s lost its presence connection (%s); reconnecting", self.worker_id, e)
                else:
                    log.debug("%s presence connection still down: %s", self.worker_id, e)
                await self._disconnect()
                self._send_vouch()
                await asyncio.sleep(reconnect_delay(self._rng))

    def _in_doubt(self) -> bool:
        """Whether the lock may be free now: the session is down (or not up yet), or its probe is late."""
        if self._conn is None or not self.ready.is_set():
            return True
        since = self._probing_since
        return since is not None and asyncio.get_running_loop().time() - since > vouch_interval(self.grace)

    async def _vouch_while_down(self) -> None:
        """While the session is down, its lock is free, and another worker may note this worker as gone
        (store.suspect): the pool, if it still reaches the database, says otherwise every quarter of the
        grace, so the runs stay with this live worker until the session is back. This runs on its own
        schedule, beside the connect attempts: one attempt may take up to CONNECT_TIMEOUT (a slow DNS,
        TLS or authentication step), far past the grace. A worker that is really gone cannot vouch."""
        await self._attempted.wait()  # nothing is held before the first attempt
        while True:
            await asyncio.sleep(vouch_interval(self.grace))
            if self._in_doubt():
                self._send_vouch()

    def _send_vouch(self) -> None:
        """One vouch through the pool, in a task of its own: the schedule never waits for an answer."""
        if not self.liveness_lock or self._duplicate is not None or len(self._vouches) >= VOUCHES_IN_FLIGHT:
            return
        task = asyncio.create_task(self._vouch(), name=f"{self.worker_id}-vouch-once")
        self._vouches.add(task)
        task.add_done_callback(self._vouches.discard)

    async def _vouch(self) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(VOUCH_TIMEOUT):
                await self.store.vouch(self.worker_id)
