"""Reading an events stream in the tests (on the CLI's own SSE parser), and what a resumed stream must hold."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson

from agentrun.worker.cli.client import ServerEvent, SseParser


class Stream:
    """Collects a run's events in the background; `until(...)` waits for one that matches."""

    def __init__(self, client: httpx.AsyncClient, url: str, last_event_id: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        self.client, self.url = client, url
        self.headers = {**(headers or {}), **({"Last-Event-ID": last_event_id} if last_event_id else {})}
        self.events: list[ServerEvent] = []
        self.comments = 0
        self.status: int | None = None
        self.closed = asyncio.Event()
        self._new = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _read(self) -> None:
        try:
            async with self.client.stream("GET", self.url, headers=self.headers, timeout=httpx.Timeout(30, read=None)) as r:
                self.status = r.status_code
                parser = SseParser()
                async for line in r.aiter_lines():
                    if line.startswith(":"):
                        self.comments += 1
                    event = parser.feed(line)
                    if event is not None:
                        self.events.append(event)
                    self._new.set()
        finally:
            self.closed.set()
            self._new.set()

    def start(self) -> Stream:
        self._task = asyncio.create_task(self._read())
        return self

    async def until(self, check: Any, timeout: float = 60.0, what: str = "an event") -> None:
        async with asyncio.timeout(timeout):
            while not check(self):
                if self.closed.is_set():
                    if self._task is not None and self._task.done() and self._task.exception():
                        raise self._task.exception()  # type: ignore[misc]
                    raise AssertionError(f"the stream closed before {what}: {[(e.event, e.data[:80]) for e in self.events]}")
                self._new.clear()
                await self._new.wait()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    @staticmethod
    def decode(event: ServerEvent) -> Any:
        return orjson.loads(event.data)

    def of(self, kind: str) -> list[Any]:
        return [orjson.loads(e.data) for e in self.events if e.event == kind]

    @property
    def ended(self) -> bool:
        return any(e.event == "end" for e in self.events)


@contextlib.asynccontextmanager
async def streaming(client: httpx.AsyncClient, url: str, **kw: Any) -> AsyncIterator[Stream]:
    s = Stream(client, url, **kw).start()
    try:
        yield s
    finally:
        await s.close()


def assert_resumed_whole(first: Stream, resumed: Stream, whole: Stream,
                         what: str = "") -> tuple[list[ServerEvent], dict[int, Any]]:
    """A stream cut (`first`) and resumed with its last id (`resumed`) has no duplicate and no gap: no step
    or run event comes twice, and every step's last state seen across the two is its final state, as a
    client that watched the whole run (`whole`) sees it. Returns the two connections' step and run events,
    in order, and the final steps by seq."""
    both = [e for e in first.events + resumed.events if e.event in ("step", "run")]
    ids = [e.id for e in both]
    assert len(ids) == len(set(ids)), f"an event was sent twice: {ids}"
    last: dict[int, Any] = {}
    for e in both:
        if e.event == "step":
            step = Stream.decode(e)
            last[step["seq"]] = step
    final = {s["seq"]: s for s in whole.of("step")}
    assert last == final, f"{what}: the resumed stream missed a change" if what else "the resumed stream missed a change"
    return both, final
