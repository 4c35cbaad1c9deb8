"""Live events of a run over server-sent events: `GET /api/runs/{id}/events`.

Changes travel through PostgreSQL, so any API process can serve any run: triggers (migration 0010)
mark each changed run and step row with its transaction (`event_xid`) and notify `agentrun_events`
with the run id; workers notify `agentrun_delta` with streamed model text (worker/deltas.py). One
`EventHub` per process LISTENs on one connection and wakes the streams of that run, which re-read the
rows. A stream's position is the (transaction, kind, seq) of the last row it sent; only rows whose
transaction is older than every transaction still running are sent, so nothing can commit behind a
position already sent, and a reconnect with `Last-Event-ID` resumes with no gap and no duplicate.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any

import orjson
import psycopg
from fastapi import APIRouter, Header, Path
from fastapi.responses import StreamingResponse
from psycopg.rows import dict_row
from pydantic import BaseModel

from agentrun.worker.api.errors import ApiError
from agentrun.worker.api.guards import ScopedRoute, access
from agentrun.worker.api.identities import Scope
from agentrun.worker.api.routes import ERRORS
from agentrun.worker.api.schemas import DecisionView, RunView, TimelineStep
from agentrun.worker.deltas import DELTA_CHANNEL
from agentrun.worker.records import PendingCall, StepKind
from agentrun.worker.store import DECISION_COLUMNS, RUN_COLUMNS, TIMELINE_COLUMNS, RunStore, _pending, _run, _step

log = logging.getLogger("agentrun.worker.api.events")

EVENTS_CHANNEL = "agentrun_events"
# The kind's place in the order of one transaction's rows: its steps, calls waiting without a step, the run.
STEP, WAITING, RUN = 0, 1, 2
Position = tuple[int, int, int]  # (event_xid, kind, seq): the order in which rows are sent
START: Position = (-1, 0, 0)
MAX_DELTAS = 256
"""Deltas a slow stream may have waiting; older ones are dropped (they are best effort)."""


@dataclasses.dataclass(eq=False)  # by identity: a member of its run's set
class Subscriber:
    run_id: uuid.UUID
    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    changed: bool = True
    deltas: list[tuple[int, str]] = dataclasses.field(default_factory=list)

    def notify(self) -> None:
        self.changed = True
        self.wake.set()

    def delta(self, seq: int, text: str) -> None:
        if len(self.deltas) >= MAX_DELTAS:
            del self.deltas[0]
        self.deltas.append((seq, text))
        self.wake.set()


class EventHub:
    """One LISTEN connection per process, opened at the first subscriber; fans notifications out in memory.

    `keepalive` is the most seconds a stream stays silent: then it sends a comment line (proxies and
    load balancers drop connections idle for long) and re-reads the run, a safety net for a lost
    notification.
    """

    def __init__(self, store: RunStore, keepalive: float = 15.0) -> None:
        self.store = store
        self.keepalive = keepalive
        self.subscribers: dict[uuid.UUID, set[Subscriber]] = {}
        self.listening = asyncio.Event()
        self.closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def subscribe(self, run_id: uuid.UUID) -> Iterator[Subscriber]:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._listen(), name="agentrun-events")
        sub = Subscriber(run_id)
        self.subscribers.setdefault(run_id, set()).add(sub)
        try:
            yield sub
        finally:
            subs = self.subscribers.get(run_id)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self.subscribers[run_id]

    async def close(self) -> None:
        """Ends every stream (their clients reconnect elsewhere) and the LISTEN connection."""
        self.closing.set()
        for subs in list(self.subscribers.values()):
            for sub in subs:
                sub.wake.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _listen(self) -> None:
        while not self.closing.is_set():
            conn: psycopg.AsyncConnection[Any] | None = None
            try:
                conn = await self.store.dedicated_connection()
                await conn.execute(f"LISTEN {EVENTS_CHANNEL}")
                await conn.execute(f"LISTEN {DELTA_CHANNEL}")
                self.listening.set()
                self._wake_all()  # whatever changed while nobody listened
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

    def _wake_all(self) -> None:
        for subs in self.subscribers.values():
            for sub in subs:
                sub.notify()

    def _dispatch(self, note: psycopg.Notify) -> None:
        if note.channel == EVENTS_CHANNEL:
            with contextlib.suppress(ValueError):
                for sub in self.subscribers.get(uuid.UUID(note.payload), ()):
                    sub.notify()
            return
        try:
            delta = orjson.loads(note.payload)
            run_id, seq, text = uuid.UUID(delta["run"]), int(delta["seq"]), str(delta["text"])
        except (ValueError, KeyError, TypeError):
            return
        for sub in self.subscribers.get(run_id, ()):
            sub.delta(seq, text)


@dataclasses.dataclass(frozen=True)
class Event:
    position: Position
    kind: str
    data: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Batch:
    events: list[Event]
    settling: bool
    """Rows changed by transactions newer than one still running: read again shortly."""
    terminal: bool
    status: str


def event_id(position: Position) -> str:
    return ".".join(str(p) for p in position)


EVENT_ID = re.compile(r"([0-9]{1,18})\.([0-2])\.([0-9]{1,10})")
"""What `event_id` makes: a transaction id (below 10^18, as PostgreSQL's are for ages), a kind, a seq."""


def parse_event_id(text: str) -> Position:
    """The position an id names; START for one this stream never sent (a proxy's or an older server's):
    such a client is served as a new one, the stored steps first, rather than refused mid-reconnect."""
    m = EVENT_ID.fullmatch(text.strip())
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else START


async def read_changes(store: RunStore, run_id: uuid.UUID, after: Position) -> Batch | None:
    """The run's rows changed after `after`, in order; None if there is no such run.

    One repeatable-read snapshot for the horizon and the rows, so they agree. A decision (run_decision)
    counts as a change of its tool call's timeline row and of the run (its pending count)."""
    since = str(max(after[0], 0))
    async with store.pool.connection() as conn, conn.transaction():
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS horizon")
        horizon_row = await cur.fetchone()
        assert horizon_row is not None
        horizon: int = horizon_row["horizon"]
        await cur.execute(
            f"SELECT {RUN_COLUMNS}, coalesce(r.event_xid, '0')::text::bigint AS event_xid FROM run r WHERE r.id = %s",
            (run_id,),
        )
        run_row = await cur.fetchone()
        if run_row is None:
            return None
        await cur.execute(
            f"""SELECT {DECISION_COLUMNS}, position, coalesce(event_xid, '0')::text::bigint AS event_xid
                FROM run_decision WHERE run_id = %s ORDER BY since, position""",
            (run_id,),
        )
        decision_rows = await cur.fetchall()
        calls: dict[str, list[tuple[PendingCall, int, int]]] = {}
        for row in decision_rows:
            xid, position = row.pop("event_xid"), row.pop("position")
            calls.setdefault(row["tool_use_id"], []).append((_pending(row), xid, position))
        touched = [use for use, found in calls.items() if max(x for _, x, _ in found) >= after[0]]
        await cur.execute(
            f"""SELECT {TIMELINE_COLUMNS}, coalesce(event_xid, '0')::text::bigint AS event_xid FROM run_step
                WHERE run_id = %s AND (coalesce(event_xid, '0') >= %s::text::xid8 OR tool_use_id = ANY(%s))
                ORDER BY seq""",
            (run_id, since, touched),
        )
        step_rows = await cur.fetchall()
    events: list[Event] = []
    settling = False

    def add(xid: int, kind: str, rank: int, seq: int, model: BaseModel) -> None:
        nonlocal settling
        if xid >= horizon:
            settling = True
        elif (xid, rank, seq) > after:
            events.append(Event((xid, rank, seq), kind, model.model_dump(mode="json", by_alias=True)))

    decision_xids = [x for found in calls.values() for _, x, _ in found]
    for row in step_rows:
        xid = row.pop("event_xid")
        step = _step(row)
        decided = calls.pop(step.tool_use_id, []) if step.kind is StepKind.TOOL and step.tool_use_id else []
        xid = max([xid, *(x for _, x, _ in decided)])
        add(xid, "step", STEP, step.seq, TimelineStep.of(step).model_copy(
            update={"decisions": [DecisionView.of(c) for c, _, _ in decided]}))
    # Calls waiting for a person with no step yet (an approval not given): rows without a seq, placed
    # by their position in the model's turn.
    for use, found in calls.items():
        if use in touched:
            waiting = TimelineStep.waiting(found[-1][0], [c for c, _, _ in found])
            add(max(x for _, x, _ in found), "step", WAITING, found[-1][2], waiting)
    run = _run({k: v for k, v in run_row.items() if k != "event_xid"})
    add(max([run_row["event_xid"], *decision_xids]), "run", RUN, 0, RunView.of(run))
    events.sort(key=lambda e: e.position)
    return Batch(events, settling, run.status.terminal and not settling, run.status.value)


def _sse(kind: str, position: Position, data: Any) -> bytes:
    return b"id: %s\nevent: %s\ndata: %s\n\n" % (event_id(position).encode(), kind.encode(), orjson.dumps(data))


async def stream_events(hub: EventHub, run_id: uuid.UUID, after: Position, first: Batch) -> AsyncIterator[bytes]:
    position = after
    batch: Batch | None = first
    last_sent = time.monotonic()
    with hub.subscribe(run_id) as sub:
        # Subscribed before the next read, so no change between the two goes unheard.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                await hub.listening.wait()
        while not hub.closing.is_set():
            if batch is not None:
                for event in batch.events:
                    position = event.position
                    yield _sse(event.kind, position, event.data)
                    last_sent = time.monotonic()
                if batch.terminal:
                    yield _sse("end", position, {"status": batch.status})
                    return
            for seq, text in sub.deltas:
                yield _sse("delta", position, {"seq": seq, "text": text})
                last_sent = time.monotonic()
            sub.deltas.clear()
            quiet = time.monotonic() - last_sent
            wait = 0.05 if batch is not None and batch.settling else max(0.0, hub.keepalive - quiet)
            sub.wake.clear()
            if not sub.changed and not sub.deltas:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await sub.wake.wait()
            if time.monotonic() - last_sent >= hub.keepalive:
                yield b": keep-alive\n\n"
                last_sent = time.monotonic()
                sub.changed = True  # the safety net: re-read as if notified
            if sub.changed or (batch is not None and batch.settling):
                sub.changed = False
                try:
                    batch = await read_changes(hub.store, run_id, position)
                except (psycopg.Error, OSError) as e:
                    log.warning("events: cannot read run %s (%s); trying again", run_id, e)
                    sub.changed = True
                    batch = None
                    await asyncio.sleep(1.0)
                    continue
                if batch is None:
                    return  # the run is gone
            else:
                batch = None


def events_router(store: RunStore, hub: EventHub, secured: bool) -> APIRouter:
    # The errors every run route documents (routes.ERRORS), 401 and 403 only when tokens are required.
    router = APIRouter(
        prefix="/api/runs", tags=["runs"], route_class=ScopedRoute,
        responses=ERRORS if secured else {k: v for k, v in ERRORS.items() if k not in (401, 403)},
    )

    @router.get(
        "/{id}/events",
        response_class=StreamingResponse,
        responses={
            200: {"content": {"text/event-stream": {}}, "description": "The run's events, until it ends"},
        },
        **access(Scope.READ, secured),
    )
    async def events(
        run_id: Annotated[uuid.UUID, Path(alias="id", description="The run's id (a UUID).")],
        # A plain string (absent: empty), so the document states its form on the string itself.
        last_event_id: Annotated[str, Header(
            alias="Last-Event-ID", description="Resume after this event: what the stream missed, nothing twice "
            "(an id this stream never sent is ignored: the stream starts from the stored steps).",
            json_schema_extra={"pattern": f"^{EVENT_ID.pattern}$"},
        )] = "",
    ) -> StreamingResponse:
        """Server-sent events of a run: `step` (a timeline row appeared or changed), `run` (the run JSON
        changed: status, tokens, cost, ...), `delta` (`{"seq", "text"}`: model text in flight, not stored,
        best effort) and `end` (the run is terminal; the stream closes). Every event has an `id`; a
        client that connects late gets the stored steps first, then live ones. A comment line
        (`: keep-alive`) comes after 15 s of silence. Scope: `read`."""
        after = parse_event_id(last_event_id) if last_event_id else START
        first = await read_changes(store, run_id, after)
        if first is None:
            raise ApiError(404, f"no run with id {run_id}")
        return StreamingResponse(
            stream_events(hub, run_id, after, first),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return router
