"""Text of a model call in flight, published for live watchers: not stored, best effort, batched.

The worker hands each streamed text fragment to a `DeltaSink`; the sink sends what gathered at most
`rate` times a second per call as one `pg_notify` on DELTA_CHANNEL, which every API process hears (the
events API, worker/api/events.py). Nothing here can fail or slow a step: a publish that fails is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Any

import orjson
from psycopg_pool import AsyncConnectionPool

from agentrun.worker.store import channels
from agentrun.worker.store.channels import DELTA_CHANNEL

log = logging.getLogger(__name__)

MAX_PAYLOAD_BYTES = 7000
"""PostgreSQL refuses a notification payload of 8000 bytes or more; this leaves room for the envelope."""


class DeltaPublisher:
    """Makes one sink per model call; `rate` is the most notifications a second a sink sends."""

    def __init__(self, pool: AsyncConnectionPool[Any], rate: float = 10.0) -> None:
        self.pool = pool
        self.interval = 1.0 / rate

    def sink(self, run_id: uuid.UUID, seq: int) -> DeltaSink:
        return DeltaSink(self, run_id, seq)

    async def publish(self, run_id: uuid.UUID, seq: int, text: str) -> None:
        for part in _parts(text):
            payload = orjson.dumps({"run": str(run_id), "seq": seq, "text": part}).decode()
            try:
                async with self.pool.connection(timeout=2) as conn:
                    await channels.notify(conn, DELTA_CHANNEL, payload)
            except Exception as e:  # best effort: watchers miss some text, the step is unaffected
                log.debug("model text of run %s not published: %s", run_id, e)
                return


class DeltaSink:
    """Called with each text fragment of one model call; `close()` sends the rest and waits for it."""

    def __init__(self, publisher: DeltaPublisher, run_id: uuid.UUID, seq: int) -> None:
        self.publisher = publisher
        self.run_id = run_id
        self.seq = seq
        self._buffer: list[str] = []
        self._last = 0.0
        self._flusher: asyncio.Task[None] | None = None
        self._sleeping = False

    def __call__(self, text: str) -> None:
        self._buffer.append(text)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_later())

    async def _flush_later(self) -> None:
        wait = self._last + self.publisher.interval - time.monotonic()
        if wait > 0:
            self._sleeping = True
            try:
                await asyncio.sleep(wait)
            finally:
                self._sleeping = False
        await self._flush()

    async def _flush(self) -> None:
        if not self._buffer:
            return
        text, self._buffer = "".join(self._buffer), []
        self._last = time.monotonic()
        await self.publisher.publish(self.run_id, self.seq, text)

    async def close(self) -> None:
        """Sends what is left; after a failed or cancelled call, call `discard()` instead."""
        if self._flusher is not None and not self._flusher.done():
            if self._sleeping:  # the rest goes now, with whatever it was waiting to send
                self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        await self._flush()

    def discard(self) -> None:
        self._buffer.clear()
        if self._flusher is not None:
            self._flusher.cancel()


def _parts(text: str) -> list[str]:
    """`text` cut so that each part's JSON (escapes included, at most 6 bytes a character) fits a payload."""
    step = MAX_PAYLOAD_BYTES // 6
    return [text[i : i + step] for i in range(0, len(text), step)] or [""]
