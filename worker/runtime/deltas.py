"""Text of a model call in flight, and the progress of a tool call, published for live watchers: not
stored, best effort, batched.

The worker hands each streamed text fragment to a `DeltaSink`; the sink sends what gathered at most
`rate` times a second per call as one `pg_notify` on DELTA_CHANNEL, which every API process hears (the
events API, worker/api/events.py). A tool call's `ProgressSink` sends the latest progress its tool
reported (an MCP server's progress notifications) on the same channel, at the same rate. Nothing here can
fail or slow a step: a publish that fails is dropped.
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
MAX_PROGRESS_MESSAGE = 1000
"""Characters of a progress message passed on (at most 6 bytes each in JSON: within the payload)."""


class DeltaPublisher:
    """Makes one sink per model call; `rate` is the most notifications a second a sink sends."""

    def __init__(self, pool: AsyncConnectionPool[Any], rate: float = 10.0) -> None:
        self.pool = pool
        self.interval = 1.0 / rate

    def sink(self, run_id: uuid.UUID, seq: int) -> DeltaSink:
        return DeltaSink(self, run_id, seq)

    def progress(self, run_id: uuid.UUID, seq: int, tool_use_id: str, tool_name: str) -> ProgressSink:
        """A sink for the progress of the tool call of step `seq`: give it as `ToolContext.progress`."""
        return ProgressSink(self, run_id, seq, tool_use_id, tool_name)

    async def publish(self, run_id: uuid.UUID, seq: int, text: str) -> None:
        for part in _parts(text):
            if not await self._notify(run_id, {"run": str(run_id), "seq": seq, "text": part}):
                return

    async def _notify(self, run_id: uuid.UUID, message: dict[str, Any]) -> bool:
        try:
            async with self.pool.connection(timeout=2) as conn:
                await channels.notify(conn, DELTA_CHANNEL, orjson.dumps(message).decode())
        except Exception as e:  # best effort: watchers miss some text, the step is unaffected
            log.debug("live news of run %s not published: %s", run_id, e)
            return False
        return True


class _Throttled:
    """What a sink shares: it sends what gathered at most once per `publisher.interval`, from one flusher task
    at a time. Subclasses keep what is to be sent, `_flush` it, and `_drop` it."""

    def __init__(self, publisher: DeltaPublisher, run_id: uuid.UUID, seq: int) -> None:
        self.publisher = publisher
        self.run_id = run_id
        self.seq = seq
        self._last = 0.0
        self._flusher: asyncio.Task[None] | None = None
        self._sleeping = False

    def _schedule(self) -> None:
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
        raise NotImplementedError

    def _drop(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        """Sends what is left; after a failed or cancelled call, call `discard()` instead."""
        if self._flusher is not None and not self._flusher.done():
            if self._sleeping:  # the rest goes now, with whatever it was waiting to send
                self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        await self._flush()

    def discard(self) -> None:
        self._drop()
        if self._flusher is not None:
            self._flusher.cancel()


class DeltaSink(_Throttled):
    """Called with each text fragment of one model call; `close()` sends the rest and waits for it."""

    def __init__(self, publisher: DeltaPublisher, run_id: uuid.UUID, seq: int) -> None:
        super().__init__(publisher, run_id, seq)
        self._buffer: list[str] = []

    def __call__(self, text: str) -> None:
        self._buffer.append(text)
        self._schedule()

    async def _flush(self) -> None:
        if not self._buffer:
            return
        text, self._buffer = "".join(self._buffer), []
        self._last = time.monotonic()
        await self.publisher.publish(self.run_id, self.seq, text)

    def _drop(self) -> None:
        self._buffer.clear()


def _parts(text: str) -> list[str]:
    """`text` cut so that each part's JSON (escapes included, at most 6 bytes a character) fits a payload."""
    step = MAX_PAYLOAD_BYTES // 6
    return [text[i : i + step] for i in range(0, len(text), step)] or [""]


class ProgressSink(_Throttled):
    """Called with each progress report of one tool call; sends the latest at most `rate` times a second
    (a watcher wants where the call is now, not every step it took). `close()` sends what is left."""

    def __init__(self, publisher: DeltaPublisher, run_id: uuid.UUID, seq: int, tool_use_id: str,
                 tool_name: str) -> None:
        super().__init__(publisher, run_id, seq)
        self.tool_use_id = tool_use_id
        self.tool_name = tool_name
        self._latest: dict[str, Any] | None = None
        self._loop = asyncio.get_running_loop()

    def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not self._loop:  # a plain tool's thread: the loop does the rest
            self._loop.call_soon_threadsafe(self, progress, total, message)
            return
        self._latest = {"toolUseId": self.tool_use_id, "toolName": self.tool_name, "progress": progress,
                        "total": total, "message": message[:MAX_PROGRESS_MESSAGE] if message else message}
        self._schedule()

    async def _flush(self) -> None:
        if self._latest is None:
            return
        latest, self._latest = self._latest, None
        self._last = time.monotonic()
        await self.publisher._notify(self.run_id, {"run": str(self.run_id), "seq": self.seq, "progress": latest})

    def _drop(self) -> None:
        self._latest = None
