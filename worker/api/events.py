"""Live events of a run over server-sent events: `GET /api/runs/{id}/events`.

Changes travel through PostgreSQL, so any API process can serve any run: triggers (migrations 0010,
0013) give each changed run, step and decision row a position and notify `agentrun_events` with the run
id; workers notify `agentrun_delta` with streamed model text and tool calls' progress (worker/runtime/deltas.py).
One `EventHub` per process LISTENs on one connection and runs one change feed (worker/store/changefeed.py):
for the runs it was told about it reads, in one query for them all, the rows changed below the horizon
(every change below it is final), and fans the events out to the streams in memory. A stream's position is
the (position, kind, seq) of the last row it sent, so a reconnect with `Last-Event-ID` resumes with no gap
and no duplicate. Only transactions writing event rows hold the horizon back; an idle stream costs no query of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import re
import time
import uuid
from collections.abc import Iterator
from typing import Annotated, Any

import orjson
import psycopg
from fastapi import APIRouter, Header, Path, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.types import Receive, Send
from starlette.types import Scope as AsgiScope

from agentrun.worker.api.common import documented_errors
from agentrun.worker.api.errors import ApiError
from agentrun.worker.api.guards import ScopedRoute, access, viewer_of
from agentrun.worker.api.identities import Scope
from agentrun.worker.api.schemas import DecisionView, RunView, TimelineStep
from agentrun.worker.core.pricing import PriceTable
from agentrun.worker.core.records import StepKind
from agentrun.worker.store import RunStore, channels
from agentrun.worker.store.changefeed import ChangeFeed, RunRows
from agentrun.worker.store.channels import DELTA_CHANNEL, EVENTS_CHANNEL

log = logging.getLogger("agentrun.worker.api.events")

# The kind's place in the order of one transaction's rows: its steps, calls waiting without a step, the run.
STEP, WAITING, RUN = 0, 1, 2
Position = tuple[int, int, int]  # (event position, kind, seq): the order in which rows are sent
START: Position = (-1, 0, 0)
MAX_DELTA_CHARS = 65536
"""Model text a slow stream may have waiting; the oldest is dropped beyond it (deltas are best effort)."""


@dataclasses.dataclass(frozen=True)
class Event:
    position: Position
    kind: str
    data: dict[str, Any]

    @property
    def row(self) -> tuple[int, int]:
        """Which row it shows (kind, seq): a newer event of the same row replaces it while unsent."""
        return self.position[1], self.position[2]

    @functools.cached_property
    def frame(self) -> bytes:
        """The event as sent, encoded once: the feed gives the same Event to every stream of its run."""
        return encode(self.kind, self.position, self.data)


@dataclasses.dataclass(frozen=True)
class Batch:
    events: list[Event]
    settling: bool
    """Rows changed at or above the horizon: not sent yet, read again when the horizon passes them."""
    terminal: bool
    status: str
    steps: int = 0
    """The run's highest step seq when it was read."""


@dataclasses.dataclass(eq=False, slots=True)  # by identity: a member of its run's set
class Subscriber:
    """One stream's queue. `seen` is the position of the newest event given to it: the feed gives it only
    newer ones. Its events wait here, the latest of each row, until the stream sends them, and so does
    the model text, gathered into one piece per model call: however slowly a client reads, its step and
    run events wait behind one delta event at most, never behind a backlog of text.

    Text of model call N waits until the stream has given the steps before N (`delivered`): the worker
    wrote step N-1 before it called the model, but the feed reads rows after their commit while text is
    passed on as it comes, so without this a watcher would see the next answer before the step it follows."""

    run_id: uuid.UUID
    seen: Position = START
    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    events: dict[tuple[int, int], Event] = dataclasses.field(default_factory=dict)
    deltas: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    progress: dict[str, tuple[int, dict[str, Any]]] = dataclasses.field(default_factory=dict)
    """The latest progress of each tool call (by tool use id) not sent yet, with its step's seq."""
    ended: str | None = None
    """The run's terminal status, once an event batch showed it with nothing left to settle."""
    gone: bool = False
    """The run is gone (pruned), or the client left: the stream ends."""
    sent: bool = True
    """Something went to the client since the last beat of the keep-alive (EventHub._beat)."""
    silent: bool = False
    """A whole beat went by with nothing sent: a keep-alive comment is due."""
    floor: int | None = None
    """The run's step count in the batch the stream began with: the client has them once it is sent."""
    delivered: int = 0
    """The highest step seq the stream has given its client (or its client had before it began)."""

    def offer(self, batch: Batch) -> None:
        if self.floor is None:
            self.floor = batch.steps
        for event in batch.events:  # in position order
            if event.position > self.seen:
                self.events[event.row] = event
                self.seen = event.position
        if batch.terminal:
            self.ended = batch.status
        self.wake.set()

    def take_events(self) -> list[Event]:
        events = sorted(self.events.values(), key=lambda e: e.position)
        self.events.clear()
        seqs = [e.position[2] for e in events if e.position[1] == STEP]
        self.delivered = max([self.delivered, self.floor or 0, *seqs])
        return events

    def delta(self, seq: int, text: str) -> None:
        if self.deltas and self.deltas[-1][0] == seq:  # one event for the text gathered meanwhile
            self.deltas[-1] = (seq, self.deltas[-1][1] + text)
        else:
            self.deltas.append((seq, text))
        excess = sum(len(t) for _, t in self.deltas) - MAX_DELTA_CHARS
        while excess > 0 and self.deltas:
            seq0, text0 = self.deltas[0]
            if len(text0) <= excess:
                del self.deltas[0]
                excess -= len(text0)
            else:
                self.deltas[0] = (seq0, text0[excess:])
                excess = 0
        self.wake.set()

    def progressed(self, seq: int, data: dict[str, Any]) -> None:
        self.progress[str(data.get("toolUseId"))] = (seq, data)
        self.wake.set()

    def take_progress(self) -> list[dict[str, Any]]:
        """The progress that may go now: of tool calls whose step (its start) the stream has given."""
        ready = [k for k, (seq, _) in self.progress.items() if seq <= self.delivered]
        return [self.progress.pop(k)[1] for k in ready]

    @property
    def progress_ready(self) -> bool:
        return any(seq <= self.delivered for seq, _ in self.progress.values())

    def take_deltas(self) -> list[tuple[int, str]]:
        """The text that may go now: of the model calls after the steps the stream has given."""
        ready = 0
        while ready < len(self.deltas) and self._may_go(self.deltas[ready][0]):
            ready += 1
        deltas, self.deltas = self.deltas[:ready], self.deltas[ready:]
        return deltas

    @property
    def deltas_ready(self) -> bool:
        return bool(self.deltas) and self._may_go(self.deltas[0][0])

    def _may_go(self, seq: int) -> bool:
        """Text of a model call may go once every step before it has: its own step is at most the next."""
        return seq <= self.delivered + 1


class EventHub:
    """One LISTEN connection and one change feed per process, started at the first subscriber.

    `keepalive` is the most seconds a stream stays silent (then it sends a comment line: proxies and load
    balancers drop connections idle for long; one beat for all the streams keeps that, not a timer each),
    and how often the feed re-reads every watched run, a safety net for a lost notification. `tick` is how
    often the feed looks at the horizon while a change waits behind a transaction still writing event rows
    (it may roll back, which notifies no one).
    """

    def __init__(self, store: RunStore, keepalive: float = 15.0, tick: float = 1.0,
                 prices: PriceTable | None = None) -> None:
        self.prices = prices  # tells a run's unknown cost (null) from a nought, as GET /api/runs/{id} does
        self.feed = ChangeFeed(store.pool)
        self.store = store
        self.keepalive = keepalive
        self.tick = tick
        self.subscribers: dict[uuid.UUID, set[Subscriber]] = {}
        self.notified: set[uuid.UUID] = set()
        """Watched runs with a change notified since the feed last read them."""
        self.settling: set[uuid.UUID] = set()
        """Watched runs with changes at or above the horizon they were read with: read again every round
        (with the horizon of the same round trip) until none is left."""
        self.horizon = -1
        """The highest horizon seen; it only grows."""
        self.rounds = 0
        """Feed rounds done (a read of the horizon and of the runs due)."""
        self.listening = asyncio.Event()
        self.closing = asyncio.Event()
        self._due = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    @contextlib.contextmanager
    def subscribe(self, run_id: uuid.UUID, first: Batch, after: Position = START) -> Iterator[Subscriber]:
        """A stream of `run_id` that has `first` (read before): the feed reads the run again at once, for
        whatever changed between that read and now, then as it changes."""
        if not self._tasks or any(t.done() for t in self._tasks):
            for task in self._tasks:
                task.cancel()
            loop = asyncio.get_running_loop()
            self._tasks = [loop.create_task(self._listen(), name="agentrun-events-listen"),
                           loop.create_task(self._feed(), name="agentrun-events-feed"),
                           loop.create_task(self._beat(), name="agentrun-events-keepalive")]
        sub = Subscriber(run_id, seen=after)
        sub.offer(first)
        self.subscribers.setdefault(run_id, set()).add(sub)
        self.notified.add(run_id)
        self._due.set()
        try:
            yield sub
        finally:
            subs = self.subscribers.get(run_id)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self.subscribers[run_id]

    async def close(self) -> None:
        """Ends every stream (their clients reconnect elsewhere), the feed and the LISTEN connection."""
        self.closing.set()
        for subs in list(self.subscribers.values()):
            for sub in subs:
                sub.wake.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    async def catch_up(self, run_id: uuid.UUID, after: Position) -> Batch | None:
        """The run's changes after `after` below the horizon now; None if there is no such run."""
        # Known before the read begins, so its snapshot sees every change below it (one that the feed
        # finds while this reads would be too new for this snapshot).
        known = self.horizon
        found, read = await self.feed.read({run_id: max(after[0], 0)})
        horizon = max(known, -1 if found is None else found)
        self.horizon = max(self.horizon, horizon)
        rows = read.get(run_id)
        return None if rows is None else changes(rows, after, horizon, self.prices)

    async def _beat(self) -> None:
        """Every half `keepalive`, wakes the streams that sent nothing since the last beat to send a comment:
        none stays silent a whole `keepalive`, and a stream waits for its events with no timer of its own."""
        while not self.closing.is_set():
            await asyncio.sleep(self.keepalive / 2)
            for subs in self.subscribers.values():
                for sub in subs:
                    if not sub.sent:
                        sub.silent = True
                        sub.wake.set()
                    sub.sent = False

    async def _listen(self) -> None:
        while not self.closing.is_set():
            conn: psycopg.AsyncConnection[Any] | None = None
            try:
                conn = await self.store.dedicated_connection()
                await channels.listen(conn, EVENTS_CHANNEL, DELTA_CHANNEL)
                self.listening.set()
                self.notified.update(self.subscribers)  # whatever changed while nobody listened
                self._due.set()
                async for note in conn.notifies():
                    self._dispatch(note)
            except (psycopg.Error, OSError) as e:
                log.warning("events: the listening connection failed (%s); reconnecting", e)
            finally:
                self.listening.clear()
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()
            await asyncio.sleep(1.0)

    def _dispatch(self, note: psycopg.Notify) -> None:
        if note.channel == EVENTS_CHANNEL:
            with contextlib.suppress(ValueError):
                run_id = uuid.UUID(note.payload)
                if run_id in self.subscribers:
                    self.notified.add(run_id)
                    self._due.set()
                elif self.settling:  # perhaps the commit of what held the horizon back
                    self._due.set()
            return
        try:
            delta = orjson.loads(note.payload)
            run_id, seq = uuid.UUID(delta["run"]), int(delta["seq"])
            progress = delta.get("progress")
            text = None if isinstance(progress, dict) else str(delta["text"])
        except (ValueError, KeyError, TypeError, AttributeError):
            return
        for sub in self.subscribers.get(run_id, ()):
            if text is None:
                sub.progressed(seq, progress)
            else:
                sub.delta(seq, text)

    async def _feed(self) -> None:
        last = 0.0
        while not self.closing.is_set():
            notified = False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.tick if self.settling else self.keepalive):
                    await self._due.wait()
                    notified = True
            self._due.clear()
            if not self.subscribers:
                self.notified.clear()
                self.settling.clear()
                continue
            if not notified and not self.settling:
                self.notified.update(self.subscribers)  # the safety net
            # Rounds at most 50 a second: a storm of commits costs the feed a bounded number of queries.
            await asyncio.sleep(max(0.0, last + 0.02 - time.monotonic()))
            last = time.monotonic()
            try:
                await self._round()
            except (psycopg.Error, OSError) as e:
                log.warning("events: cannot read the changes (%s); trying again", e)
                await asyncio.sleep(1.0)
                self._due.set()

    async def _round(self) -> None:
        known = self.horizon  # as in catch_up: fixed before the read
        self.settling &= self.subscribers.keys()
        due = {r for r in self.notified if r in self.subscribers} | self.settling
        self.notified.clear()
        self.settling = set()
        if not due:
            return
        # The streams of each run now, and the oldest position among them: what the read starts from.
        targets = {r: list(self.subscribers[r]) for r in due}
        after = {r: min(s.seen for s in subs) for r, subs in targets.items()}
        try:
            found, rows = await self.feed.read({r: max(a[0], 0) for r, a in after.items()})
        except BaseException:
            self.notified |= due
            raise
        if found is None:  # a writer between taking its position and saying so: a moment more
            self.notified |= due
            self._due.set()
            return
        horizon = max(known, found)
        self.horizon = max(self.horizon, horizon)
        for run_id, subs in targets.items():
            run_rows = rows.get(run_id)
            if run_rows is None:  # the run is gone (pruned)
                for sub in subs:
                    sub.gone = True
                    sub.wake.set()
                continue
            batch = changes(run_rows, after[run_id], horizon, self.prices)
            if batch.settling:
                self.settling.add(run_id)
            for sub in subs:
                sub.offer(batch)
        self.rounds += 1


def event_id(position: Position) -> str:
    return ".".join(str(p) for p in position)


EVENT_ID = re.compile(r"([0-9]{1,18})\.([0-2])\.([0-9]{1,10})")
"""What `event_id` makes: a position (below 10^18; positions continue the transaction ids that were used
before migration 0013, so ids from before it stay valid), a kind, a seq."""


def parse_event_id(text: str) -> Position:
    """The position an id names; START for one this stream never sent (a proxy's or an older server's):
    such a client is served as a new one, the stored steps first, rather than refused mid-reconnect."""
    m = EVENT_ID.fullmatch(text.strip())
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else START


def changes(rows: RunRows, after: Position, horizon: int, prices: PriceTable | None = None) -> Batch:
    """The events of a run's rows after `after` and below `horizon`, in order. A decision (run_decision)
    counts as a change of its tool call's timeline row and of the run (its pending count)."""
    events: list[Event] = []
    settling = False

    def add(position: int, kind: str, rank: int, seq: int, model: BaseModel) -> None:
        nonlocal settling
        if position >= horizon:
            settling = True
        elif (position, rank, seq) > after:
            events.append(Event((position, rank, seq), kind, model.model_dump(mode="json", by_alias=True)))

    calls = dict(rows.decisions)
    for position, step in rows.steps:
        decided = calls.pop(step.tool_use_id, []) if step.kind is StepKind.TOOL and step.tool_use_id else []
        position = max([position, *(d.position for d in decided)])
        add(position, "step", STEP, step.seq, TimelineStep.of(step).model_copy(
            update={"decisions": [DecisionView.of(d.call) for d in decided]}))
    # Calls waiting for a person with no step yet (an approval not given): rows without a seq, placed
    # by their position in the model's turn.
    for found in calls.values():
        position = max(d.position for d in found)
        if position >= after[0]:
            waiting = TimelineStep.waiting(found[-1].call, [d.call for d in found])
            add(position, "step", WAITING, found[-1].place, waiting)
    every_decision = [d.position for found in rows.decisions.values() for d in found]
    add(max([rows.position, *every_decision]), "run", RUN, 0, RunView.of(rows.run, prices))
    events.sort(key=lambda e: e.position)
    return Batch(events, settling, rows.run.status.terminal and not settling, rows.run.status.value, rows.run.steps)


def encode(kind: str, position: Position, data: Any) -> bytes:
    """One server-sent event as a stream sends it."""
    return b"id: %s\nevent: %s\ndata: %s\n\n" % (event_id(position).encode(), kind.encode(), orjson.dumps(data))


async def stream_events(closing: asyncio.Event, sub: Subscriber, after: Position, send: Send) -> None:
    """Writes the stream's events to `send` as they come, whatever is ready in one write: a stream that
    falls behind (a busy process, a slow client) sends what gathered meanwhile together, the latest of each
    row once, instead of a write per feed round."""
    position = after
    while not closing.is_set():
        sub.wake.clear()  # whatever comes from here on wakes it again
        out: list[bytes] = []
        # The text that came first goes first (it was published before the step that holds it was
        # written); gathered into one event per model call, it never keeps the events waiting long.
        for seq, text in sub.take_deltas():
            out.append(encode("delta", position, {"seq": seq, "text": text}))
        # Progress of the calls whose step the stream has given, before the steps that end them.
        for data in sub.take_progress():
            out.append(encode("progress", position, data))
        for event in sub.take_events():
            position = event.position
            out.append(event.frame)
        if sub.ended is not None:
            out.append(encode("end", position, {"status": sub.ended}))
            await _write(send, out)
            return
        if out:
            await _write(send, out)
            sub.sent = True
        if sub.gone:
            return  # the run is gone, or the client
        if not out and sub.silent:
            await _write(send, [b": keep-alive\n\n"])
            sub.sent, sub.silent = True, False
        if not sub.wake.is_set():
            await sub.wake.wait()


async def _write(send: Send, frames: list[bytes]) -> None:
    await send({"type": "http.response.body", "body": b"".join(frames), "more_body": True})


async def _until_left(receive: Receive, sub: Subscriber) -> None:
    """Waits for the client to go away, then ends its stream."""
    while (await receive())["type"] != "http.disconnect":
        pass
    sub.gone = True
    sub.wake.set()


class EventStream(StreamingResponse):
    """A run's events as the response: written straight to the server, with one task watching for the
    client to leave. (StreamingResponse itself pulls from an async generator in a task group of two tasks:
    more work for every write and more memory for every stream, and a stream mostly writes.)"""

    def __init__(self, hub: EventHub, run_id: uuid.UUID, after: Position, first: Batch) -> None:
        self.hub, self.run_id, self.after = hub, run_id, after
        self.first: Batch | None = first
        self.status_code = 200
        self.media_type = "text/event-stream"  # set here, not on the class: the class's is the document's
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        first, self.first = self.first, None  # the stored steps: held by the stream only until it sends them
        assert first is not None
        with self.hub.subscribe(self.run_id, first, self.after) as sub:
            watching = asyncio.get_running_loop().create_task(_until_left(receive, sub))
            try:
                await stream_events(self.hub.closing, sub, self.after, send)
            finally:
                watching.cancel()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def events_router(store: RunStore, hub: EventHub, secured: bool) -> APIRouter:
    # The errors every run route documents (common.ERRORS), 401 and 403 only when tokens are required.
    router = APIRouter(
        prefix="/api/runs", tags=["runs"], route_class=ScopedRoute,
        responses=documented_errors(secured),
    )

    @router.get(
        "/{id}/events",
        response_class=EventStream,
        status_code=200,  # else FastAPI looks for it in the signature of the response class, which has none
        responses={
            200: {"content": {"text/event-stream": {}}, "description": "The run's events, until it ends"},
        },
        **access(Scope.READ, secured),
    )
    async def events(
        run_id: Annotated[uuid.UUID, Path(alias="id", description="The run's id (a UUID).")],
        request: Request,
        # A plain string (absent: empty), so the document states its form on the string itself.
        last_event_id: Annotated[str, Header(
            alias="Last-Event-ID", description="Resume after this event: what the stream missed, nothing twice "
            "(an id this stream never sent is ignored: the stream starts from the stored steps).",
            json_schema_extra={"pattern": f"^{EVENT_ID.pattern}$"},
        )] = "",
    ) -> EventStream:
        """Server-sent events of a run: `step` (a timeline row appeared or changed), `run` (the run JSON
        changed: status, tokens, cost, ...), `delta` (`{"seq", "text"}`: model text in flight, not stored,
        best effort), `progress` (`{"toolUseId", "toolName", "progress", "total", "message"}`: the latest
        progress an MCP server reported of a tool call in flight, not stored, best effort) and `end` (the
        run is terminal; the stream closes). Every event has an `id`; a client that connects late gets the
        stored steps first, then live ones. A comment line
        (`: keep-alive`) comes after 15 s of silence. Scope: `read`."""
        if not await store.scoped(viewer_of(request)).sees(run_id):
            raise ApiError(404, f"no run with id {run_id}")
        after = parse_event_id(last_event_id) if last_event_id else START
        first = await hub.catch_up(run_id, after)
        if first is None:
            raise ApiError(404, f"no run with id {run_id}")
        return EventStream(hub, run_id, after, first)

    return router
